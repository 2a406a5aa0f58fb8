#!/usr/bin/env bash
# fused_loss_sharded_test.sh STRATA TOML WORK: fused_loss through a sharded run's life. 6 steps
# under fsdp 3 with the head in its own unit (min_params = 1: the unit ending the model is held
# through the loss), a checkpoint every 2; cut after step 4's, the saved strategy resumed on 4
# ranks as tensor 2 x pipeline 2 (the head's stage computes the vocab-parallel fused loss) to
# step 6; exported. Every step's loss equals one
# process's unfused run within 1e-5 (reduction order differs across layouts), evaluation included.
set -uo pipefail
strata=$1 toml=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
fail=0
check() { echo "fused_loss_sharded_test: $1" >&2; fail=1; }
common=(--set job.threads=1 --set job.global_batch=12 --set job.micro_batch=2 --set job.eval_every=2 --set job.log_every=1
        --set model.n_layer=4 --set job.model=llama --set model.n_kv_head=2)
"$strata" run "$toml" --out "$work/one" "${common[@]}" --set job.steps=6 --set job.checkpoint_every=0 --disable fused_loss \
  > "$work/one.txt" 2>&1 || check "the single-process run failed: $(tail -3 "$work/one.txt")"
"$strata" run -n 3 "$toml" --out "$work/run" "${common[@]}" --set job.steps=6 --set job.checkpoint_every=2 \
  --set pass.fsdp.enabled=true --set pass.fsdp.min_params=1 > "$work/fsdp.txt" 2>&1 || check "fsdp 3 failed: $(tail -3 "$work/fsdp.txt")"
grep -q "^fused_loss: head.lm_head and the cross entropy computed by" "$work/fsdp.txt" || check "fused_loss did not say what computes the loss"
rm -rf "$work/run/checkpoints/step_00000006"
head -4 "$work/run/metrics.jsonl" > "$work/fsdp_metrics.jsonl" && mv "$work/fsdp_metrics.jsonl" "$work/run/metrics.jsonl"
"$strata" run -n 4 "$work/run/strategy.toml" --out "$work/run" --resume --set job.steps=6 --set parallel.pipeline=2 \
  --set parallel.tensor=2 --set pass.fsdp.enabled=false --set pass.pipeline_parallel.enabled=true --set pass.tensor_parallel.enabled=true \
  > "$work/resume.txt" 2>&1 || check "resuming as tensor 2 x pipeline 2 failed: $(tail -3 "$work/resume.txt")"
grep -q "^fused_loss: head.lm_head and the cross entropy computed by the vocab-parallel chunked loss over 2 tensor ranks" "$work/resume.txt" ||
  check "the resumed run did not use the vocab-parallel fused loss"
grep -q "resumed from .*step_00000004 at step 4" "$work/resume.txt" || check "the resume did not start from step 4: $(tail -3 "$work/resume.txt")"
"$strata" ckpt export "$work/run" "$work/hf" > "$work/export.txt" 2>&1 || check "export failed: $(tail -3 "$work/export.txt")"
[ -s "$work/hf/model.safetensors" ] || check "export wrote no model"
python3 - "$work/one/metrics.jsonl" "$work/run/metrics.jsonl" <<'PY' || check "the losses differ from one process's unfused run"
import json, sys
def rows(path):
    return {r["step"]: r for r in map(json.loads, open(path))}
one, run = rows(sys.argv[1]), rows(sys.argv[2])
assert sorted(run) == list(range(1, 7)), sorted(run)
worst = 0.0
for step, r in run.items():
    for key in ("loss", "val_loss"):
        if key in one[step] or key in r:
            worst = max(worst, abs(r[key] - one[step][key]) / abs(one[step][key]))
print(f"fused_loss under fsdp 3 then tensor 2 x pipeline 2 against one process unfused: worst relative difference {worst:.3e}")
assert worst <= 1e-5, worst
PY
exit $fail
