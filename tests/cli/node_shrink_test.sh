#!/usr/bin/env bash
# node_shrink_test.sh STRATA STRATEGY WORKDIR: a node that does not come back. 6 ranks on 3
# simulated nodes with snapshot replicas (R = 1, [job] min_ranks 4); node 2 is lost (its ranks
# killed, its snapshot store deleted) as step 5 starts, in every attempt. After the second loss
# the supervisor leaves the node out: the run continues on 4 ranks (2 nodes) from the newest
# complete snapshot, resharded from the nodes' memory (node 2's images from node 0's replicas),
# 0 bytes of checkpoint from disk, and every step's loss matches the uninterrupted 6-rank run's
# within the rounding of a different reduction order. Then 4 ranks on 2 nodes losing node 1
# twice: one node cannot hold a replica, so the run stops with one line naming the fix (exit 2).
set -euo pipefail
strata=$1 strategy=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
small=(--set job.steps=12 --set job.checkpoint_every=3 --set job.log_every=4 --set job.global_batch=12 --set job.threads=1
       --set job.max_restarts=3 --set job.restart_backoff=0.1 --set job.hang_timeout=10 --set model.n_layer=1 --set model.seq_len=32
       --set job.flash_every=1 --set job.snapshot_replicas=1)
"$strata" run -n 6 "$strategy" --out "$work/full" "${small[@]}" --simulate-nodes 3 > "$work/full.log" 2>&1 || { cat "$work/full.log"; exit 1; }
STRATA_FAULT="lose_node 2 5" STRATA_FAULT_EVERY_ATTEMPT=1 "$strata" run -n 6 "$strategy" --out "$work/shrunk" "${small[@]}" --simulate-nodes 3 \
  --set job.min_ranks=4 > "$work/shrunk.log" 2>&1 || { cat "$work/shrunk.log"; exit 1; }
events="$work/shrunk/events.jsonl"
grep -q '"event":"shrink".*"from":6,"to":4,"excluded_node":2,"excluded_ranks":\[4,5\]' "$events" || { cat "$events"; exit 1; }
grep -q "node 2 was lost in two attempts in a row; continuing on 4 ranks (2 nodes)" "$work/shrunk.log" || { cat "$work/shrunk.log"; exit 1; }
last=$(grep '"event":"recovered"' "$events" | tail -1)
grep -q '"sources":\["memory","memory","memory","memory"\],"disk_checkpoint_bytes":0,' <<< "$last" || { echo "the 4 ranks did not restore from memory: $last"; exit 1; }
grep -q '"event":"finish".*"restarts":2' "$events" || { cat "$events"; exit 1; }
"$(dirname "$0")/same_losses.sh" "6 ranks on 3 nodes -> 4 ranks on 2 nodes after node 2 was lost twice" 1e-5 12 "$work/full" "$work/shrunk"

status=0
STRATA_FAULT="lose_node 1 5" STRATA_FAULT_EVERY_ATTEMPT=1 "$strata" run -n 4 "$strategy" --out "$work/one_node" "${small[@]}" --simulate-nodes 2 \
  --set job.min_ranks=2 > "$work/one_node.log" 2>&1 || status=$?
[ "$status" -eq 2 ] || { echo "losing 1 of 2 nodes with replicas exited $status, not 2"; cat "$work/one_node.log"; exit 1; }
grep -q '^strata: error: \[job\] snapshot_replicas = 1 needs 2 nodes or more; this job.s ranks are on 1 node; continue with `strata run -n 2 .* --resume --set job.snapshot_replicas=0`$' \
  "$work/one_node.log" || { cat "$work/one_node.log"; exit 1; }
[ -d "$work/one_node/checkpoints/step_00000003" ] || { echo "the step-3 checkpoint is not on disk"; exit 1; }
echo "one node left with snapshot_replicas = 1: refused in one line, exit 2, the step-3 checkpoint kept"
rm -rf "$work"
