#!/usr/bin/env bash
# amp_inject_test.sh STRATA PYTHON INJECT_PLUGIN_DIR STRATEGY WORKDIR [RUN_ARGS...]
# fp16 amp with ddp on 2 ranks; the inject_nonfinite test pass makes one gradient element on rank
# 1 infinite at step 3. Requires: step 3 and only step 3 is skipped (on both ranks: the
# run is bit-identical to one injecting on rank 0, and the optimizer took 7 of 8 steps), the loss scale halves after it, and
# the skip is counted.
set -euo pipefail
strata=$1 python=$2 plugins=$3 strategy=$4 work=$5
shift 5
rm -rf "$work" && mkdir -p "$work"
{ cat "$strategy"; printf '\n[[pass]]\nname = "inject_nonfinite"\nstep = 3\nrank = 1\n'; } > "$work/strategy.toml"
STRATA_PLUGIN_PATH=$plugins "$strata" run -n 2 "$work/strategy.toml" --out "$work/run" --set 'pass.amp.dtype="fp16"' \
  --set job.steps=8 --set job.eval_every=0 "$@" > "$work/run.log" 2>&1 || { cat "$work/run.log"; exit 1; }
m=$work/run/metrics.jsonl
value() { grep "\"step\":$1," "$m" | sed -E "s/.*\"$2\":([^,}]*).*/\\1/"; }
[[ $(grep -c '"amp_skipped":1\.' "$m") == 1 ]] || { echo "expected exactly one skipped step"; cat "$m"; exit 1; }
[[ $(value 3 amp_skipped) == 1.000 ]] || { echo "step 3 was not the skipped one"; cat "$m"; exit 1; }
[[ $(value 3 amp_loss_scale) == 65536.000 && $(value 4 amp_loss_scale) == 32768.000 ]] || { echo "no backoff after step 3"; cat "$m"; exit 1; }
[[ $(value 8 amp_skipped_steps) == 1.000 ]] || { echo "skipped steps not counted"; cat "$m"; exit 1; }
# The same run with the injection on rank 0 instead: if both ranks skip step 3 (as they must),
# the two runs are bit-identical; if only the injected rank skipped, each run would have the other
# rank's replicas step, and the checkpoints (whose replicated tensors the ranks write in turns)
# would differ.
{ cat "$strategy"; printf '\n[[pass]]\nname = "inject_nonfinite"\nstep = 3\nrank = 0\n'; } > "$work/rank0.toml"
STRATA_PLUGIN_PATH=$plugins "$strata" run -n 2 "$work/rank0.toml" --out "$work/rank0" --set 'pass.amp.dtype="fp16"' \
  --set job.steps=8 --set job.eval_every=0 "$@" > "$work/rank0.log" 2>&1 || { cat "$work/rank0.log"; exit 1; }
"$strata" ckpt consolidate "$work/run" "$work/rank1.safetensors" > /dev/null
"$strata" ckpt consolidate "$work/rank0" "$work/rank0.safetensors" > /dev/null
"$python" - "$work" <<'PY'
import sys
from safetensors.torch import load_file
one, zero = load_file(f"{sys.argv[1]}/rank1.safetensors"), load_file(f"{sys.argv[1]}/rank0.safetensors")
if "optimizer/step" in one:  # sgd counts no steps
    assert one["optimizer/step"].item() == 7, f"optimizer took {one['optimizer/step'].item()} steps, expected 7"
for name, t in one.items():
    if name.startswith(("model/", "optimizer/")):
        assert zero[name].equal(t), f"{name} differs between injecting on rank 1 and on rank 0: a rank stepped"
print("step 3 skipped on both ranks (injecting on rank 0 or 1 gives identical checkpoints), scale backed off 65536 -> 32768, optimizer took 7 of 8 steps")
PY
