#!/usr/bin/env bash
# srun_test.sh STRATA STRATEGY WORKDIR
# Ranks started by a real Slurm `srun` (skipped, exit 77, where no Slurm controller answers:
# CI has none; docs/distributed.md says how one node was set up to run it). Two tasks on one
# node, once through MPI (srun --mpi=pmix: Debian's OpenMPI takes its rank from PMIx) and once
# through c10d (MASTER_ADDR/PORT exported as a batch script would); each matches one process
# within 2e-6 and every rank logs Slurm as its launcher with the right local rank and size.
set -euo pipefail
strata=$1 strategy=$2 work=$3
command -v srun > /dev/null && timeout 5 sinfo > /dev/null 2>&1 || { echo "no Slurm controller answers here: skipped"; exit 77; }
rm -rf "$work" && mkdir -p "$work"
"$strata" run "$strategy" --disable ddp --out "$work/one" > "$work/one.log" 2>&1 || { cat "$work/one.log"; exit 1; }
check() {  # NAME
  for rank in 0 1; do
    grep -q "rank $rank of 2, local rank $rank of 2 on host .* (launcher slurm)" "$work/$1/logs/rank_$rank.log" ||
      { echo "$1: rank $rank's log does not name Slurm"; head -2 "$work/$1/logs/rank_$rank.log"; exit 1; }
  done
  "$(dirname "$0")/same_losses.sh" "srun, 2 tasks ($1)" 2e-6 12 "$work/one" "$work/$1"
}
OMP_NUM_THREADS=1 timeout 300 srun --mpi=pmix -n 2 "$strata" run "$strategy" --out "$work/mpi" > "$work/mpi.log" 2>&1 ||
  { cat "$work/mpi.log"; exit 1; }
check mpi
OMP_NUM_THREADS=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$((20000 + $$ % 20000)) timeout 300 srun -n 2 "$strata" run "$strategy" \
  --set parallel.backend=c10d --out "$work/c10d" > "$work/c10d.log" 2>&1 || { cat "$work/c10d.log"; exit 1; }
check c10d
