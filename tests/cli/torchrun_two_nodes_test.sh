#!/usr/bin/env bash
# torchrun_two_nodes_test.sh STRATA TORCHRUN STRATEGY WORKDIR
# Two "nodes" on this machine: two torchrun agents (--nnodes 2, node ranks 0 and 1) meet through
# a c10d rendezvous and start 2 workers each, so ranks 2 and 3 have LOCAL_RANK 0 and 1 on the
# second node. ddp over the 4 ranks must match one process within 2e-6 (rank and local rank
# kept apart everywhere: data slices, devices, logs).
set -euo pipefail
strata=$1 torchrun=$2 strategy=$3 work=$4
rm -rf "$work" && mkdir -p "$work/tmp"
export TMPDIR="$work/tmp"  # torchrun's agent keeps its logs in a fresh TMPDIR/torchelastic_* directory
"$strata" run "$strategy" --disable ddp --out "$work/one" > "$work/one.log" 2>&1 || { cat "$work/one.log"; exit 1; }
port=$((20000 + $$ % 20000))
node() {  # NODE_RANK
  OMP_NUM_THREADS=1 "$torchrun" --nnodes 2 --nproc-per-node 2 --node-rank "$1" --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$port" \
    --rdzv-id strata-two-nodes --no-python "$strata" run "$strategy" --out "$work/nodes" > "$work/node$1.log" 2>&1
}
node 0 & first=$!
node 1 || { wait "$first" || true; cat "$work/node1.log" "$work/node0.log"; exit 1; }
wait "$first" || { cat "$work/node0.log"; exit 1; }
for rank in 0 1 2 3; do
  [[ -s $work/nodes/logs/rank_$rank.log ]] || { echo "no log of rank $rank"; exit 1; }
done
"$(dirname "$0")/same_losses.sh" "two nodes x 2 ranks (torchrun, c10d)" 2e-6 12 "$work/one" "$work/nodes"
