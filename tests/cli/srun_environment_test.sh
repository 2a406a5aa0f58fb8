#!/usr/bin/env bash
# srun_environment_test.sh STRATA STRATEGY WORKDIR
# Ranks as Slurm's srun starts them (no Slurm here: two processes given the variables srun sets,
# SLURM_PROCID/NTASKS/LOCALID/NTASKS_PER_NODE, plus the MASTER_ADDR and MASTER_PORT a batch
# script exports) meet through the c10d backend, without MPI. ddp over 2 ranks must match one
# process within 2e-6, and each rank must log under its Slurm rank.
set -euo pipefail
strata=$1 strategy=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
"$strata" run "$strategy" --disable ddp --out "$work/one" > "$work/one.log" 2>&1 || { cat "$work/one.log"; exit 1; }
port=$((20000 + $$ % 20000))
task() {  # SLURM_PROCID
  env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE OMP_NUM_THREADS=1 \
    SLURM_PROCID="$1" SLURM_NTASKS=2 SLURM_LOCALID="$1" SLURM_NTASKS_PER_NODE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" \
    "$strata" run "$strategy" --set parallel.backend=c10d --out "$work/srun" > "$work/task$1.log" 2>&1
}
task 0 & first=$!
task 1 || { wait "$first" || true; cat "$work/task1.log" "$work/task0.log"; exit 1; }
wait "$first" || { cat "$work/task0.log"; exit 1; }
for rank in 0 1; do
  [[ -s $work/srun/logs/rank_$rank.log ]] || { echo "no log of rank $rank"; ls "$work/srun" "$work/srun/logs" || true; exit 1; }
done
"$(dirname "$0")/same_losses.sh" "srun environment, 2 ranks (c10d)" 2e-6 12 "$work/one" "$work/srun"
