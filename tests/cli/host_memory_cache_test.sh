#!/usr/bin/env bash
# host_memory_cache_test.sh STRATA WORK: [job] host_memory = "cache" changes where tensors live, not
# what they hold or how many bytes are live. fsdp at 2 ranks (every unit gathered and freed each
# step) and zero2 at 3, with an evaluation and a checkpoint every 2 steps (blocks one step takes
# and the next does not): the losses equal "keep"'s bit for bit, and the peak of live tensor bytes
# within 64 bytes (a 16-byte scalar's allocation moves between steps from run to run, either mode).
set -euo pipefail
strata=$1 work=$2
field() { grep -o "\"$1\":[0-9.]*" "$2" | tail -1 | cut -d: -f2; }
for layout in "fsdp 2" "zero2 3"; do
  set -- $layout
  common=(-n "$2" tests/cli/parity.toml --disable ddp --set "pass.$1.enabled=true" --set "parallel.data=$2" --set job.global_batch=12
          --set job.steps=6 --set job.eval_every=2 --set job.checkpoint_every=2)
  "$(dirname "$0")/compare_runs.sh" "$strata" "$work/$1" same 0 -- "${common[@]}" --set job.host_memory=keep \
    -- "${common[@]}" --set job.host_memory=cache
  keep=$(field mem_device_peak_bytes "$work/$1/a/metrics.jsonl") cache=$(field mem_device_peak_bytes "$work/$1/b/metrics.jsonl")
  echo "$1 at $2 ranks: live tensor peak $keep bytes with keep, $cache with cache"
  awk -v k="$keep" -v c="$cache" 'BEGIN { exit !(k > 0 && k - c <= 64 && c - k <= 64) }' ||
    { echo "the live tensor peaks differ"; exit 1; }
done
