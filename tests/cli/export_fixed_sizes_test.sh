#!/usr/bin/env bash
# A run whose strategy fixes its [parallel] sizes (data = 2) exports and consolidates: the saved
# strategy is resolved for the world size that saved the checkpoint, not for one rank.
#   export_fixed_sizes_test.sh STRATA STRATEGY WORK_DIR
set -euo pipefail
strata=$1 strategy=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
"$strata" run -n 2 "$strategy" --out "$work/run" --set parallel.data=2 --set job.steps=2 --set job.eval_every=0 \
  --set job.threads=1 > "$work/run.log" 2>&1 || { cat "$work/run.log"; exit 1; }
grep -q '^data = 2' "$work/run/strategy.toml" || { echo "FAIL: the saved strategy does not fix data = 2"; exit 1; }
"$strata" ckpt export "$work/run" "$work/hf"
test -s "$work/hf/model.safetensors"
"$strata" ckpt consolidate "$work/run" "$work/all.safetensors"
test -s "$work/all.safetensors"
echo "OK: export and consolidate of a run saved with [parallel] data = 2"
