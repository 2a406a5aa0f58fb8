#!/usr/bin/env bash
# elastic_test.sh STRATA STRATEGY WORKDIR [EXTRA --set ...]
# Trains 12 steps on 4 ranks uninterrupted; then again with rank 3 killed at step 5 in every
# attempt ([job] min_ranks 3). After the second kill of the same rank the supervisor continues
# on 3 ranks from the step-3 checkpoint, resharded. The run must finish by itself, record the
# shrink in events.jsonl, and every step's loss must match the 4-rank run's (same samples in the
# same order: the global batch does not depend on the world size), within the rounding of a
# different reduction order.
set -euo pipefail
strata=$1 strategy=$2 work=$3
shift 3
rm -rf "$work" && mkdir -p "$work"
small=(--set job.steps=12 --set job.checkpoint_every=3 --set job.log_every=4 --set job.global_batch=12 --set job.threads=1
       --set job.max_restarts=3 --set job.restart_backoff=0.1 --set job.min_ranks=3 --set model.n_layer=1 --set model.seq_len=32 "$@")
"$strata" run -n 4 "$strategy" --out "$work/full" "${small[@]}" > "$work/full.log"
STRATA_FAULT="kill 3 5" STRATA_FAULT_EVERY_ATTEMPT=1 "$strata" run -n 4 "$strategy" --out "$work/shrunk" "${small[@]}" > "$work/shrunk.log" 2>&1 ||
  { cat "$work/shrunk.log"; exit 1; }
grep -q '"event":"shrink".*"from":4,"to":3,"excluded_rank":3' "$work/shrunk/events.jsonl" || { cat "$work/shrunk/events.jsonl"; exit 1; }
grep -q '"event":"finish".*"restarts":2' "$work/shrunk/events.jsonl" || { cat "$work/shrunk/events.jsonl"; exit 1; }
if [[ " $* " == *" job.flash_every="* ]]; then  # the 3 ranks load the 4 ranks' snapshot from memory, resharded
  sed -n '/continuing on 3 ranks/,$p' "$work/shrunk.log" | grep -q 'resumed from the flash snapshot of step 4 in shared memory (4 ranks saved it[;)]' ||
    { echo "the 3-rank attempt did not load the 4-rank snapshot from shared memory:"; cat "$work/shrunk.log"; exit 1; }
fi
"$(dirname "$0")/same_losses.sh" "4 -> 3 ranks at step 5" 1e-5 12 "$work/full" "$work/shrunk"
