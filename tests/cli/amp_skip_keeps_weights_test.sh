#!/usr/bin/env bash
# amp_skip_keeps_weights_test.sh STRATA PYTHON INJECT_PLUGIN_DIR STRATEGY WORKDIR [RUN_ARGS...]
# amp fp16: the inject_nonfinite test pass makes a gradient element infinite at step 2 on data rank
# 0 (and only on pipeline stage INJECT_PIPELINE_RANK, if set), with a checkpoint after every step. Requires: the checkpoints of steps 1 and 2 hold the same
# model and optimizer tensors (everything that steps, WSAM's decoupled step included, kept its
# values) and step 3's differ (training went on).
set -euo pipefail
strata=$1 python=$2 plugins=$3 strategy=$4 work=$5
shift 5
rm -rf "$work" && mkdir -p "$work"
{ cat "$strategy"; printf '\n[[pass]]\nname = "inject_nonfinite"\nstep = 2\nrank = 0\npipeline_rank = %s\n' "${INJECT_PIPELINE_RANK:--1}"; } \
  > "$work/strategy.toml"
STRATA_PLUGIN_PATH=$plugins "$strata" run "$work/strategy.toml" --out "$work/run" --set 'pass.amp.dtype="fp16"' \
  --set job.steps=3 --set job.eval_every=0 --set job.checkpoint_every=1 --set job.keep_checkpoints=3 "$@" \
  > "$work/run.log" 2>&1 || { cat "$work/run.log"; exit 1; }
grep -q '"step":2,.*"amp_skipped":1\.' "$work/run/metrics.jsonl" || { echo "step 2 was not skipped"; cat "$work/run/metrics.jsonl"; exit 1; }
for step in 1 2 3; do
  "$strata" ckpt consolidate "$work/run/checkpoints/step_0000000$step" "$work/step$step.safetensors" > /dev/null
done
"$python" - "$work" <<'PY'
import sys
from safetensors.torch import load_file
one, two, three = (load_file(f"{sys.argv[1]}/step{s}.safetensors") for s in (1, 2, 3))
kept = [n for n in one if n.startswith(("model/", "optimizer/"))]
assert kept, "no model or optimizer tensors"
for name in kept:
    assert one[name].equal(two[name]), f"{name} changed in the skipped step 2"
assert any(not two[n].equal(three[n]) for n in kept if n.startswith("model/")), "step 3 changed nothing"
print(f"step 2 skipped: its checkpoint equals step 1's in all {len(kept)} model and optimizer tensors; step 3 trained")
PY
