#!/usr/bin/env bash
# diverged_test.sh STRATA INJECT_PLUGIN_DIR STRATEGY WORKDIR
# A step whose gradient norm is not finite and that no pass skipped ends the run ([job] nonfinite =
# "stop", the default) before that step's evaluation and checkpoint: the inject_nonfinite test
# pass makes one gradient element infinite at step 3 (no amp to skip it). One process and
# `strata run -n 2` (not restarted: a restart would diverge again): exit 2, one line naming the
# step, the value and the checkpoint saved before it; metrics.jsonl up to the step read; no
# checkpoint after step 2. With nonfinite = "continue" the run trains on to its end, NaN and all.
set -uo pipefail
strata=$1 plugins=$2 strategy=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
{ cat "$strategy"; printf '\n[[pass]]\nname = "inject_nonfinite"\nstep = 3\nrank = 0\n'; } > "$work/strategy.toml"
small=(--set job.steps=8 --set job.eval_every=0 --set job.checkpoint_every=2 --set job.log_every=8 --set job.threads=1
       --set job.global_batch=4 --set model.n_layer=1 --set model.seq_len=32)
fail=0
check() { echo "diverged_test: $1" >&2; fail=1; }
for ranks in 1 2; do
  out=$work/run_$ranks
  STRATA_PLUGIN_PATH=$plugins "$strata" run -n $ranks "$work/strategy.toml" --out "$out" "${small[@]}" > "$out.log" 2>&1
  status=$?
  errors=$(grep -c "^strata: error" "$out.log")
  [[ $status == 2 && $errors == 1 ]] || check "$ranks rank(s): status $status, $errors error lines: $(cat "$out.log")"
  grep -q "^strata: error: training diverged at step 3: the gradient norm is inf and no pass skipped the step, so the weights are no longer finite; the newest checkpoint, step_00000002, was saved before it. Lower \[optimizer\] lr" "$out.log" ||
    check "$ranks rank(s): the divergence is not named: $(cat "$out.log")"
  [[ $(ls "$out/checkpoints" | grep -c '^step_') == 1 && -d $out/checkpoints/step_00000002 ]] || check "$ranks rank(s): checkpoints $(ls "$out/checkpoints")"
  [[ $(grep -c '"step":' "$out/metrics.jsonl") == 4 ]] || check "$ranks rank(s): metrics.jsonl does not end at step 4, the step read: $(cat "$out/metrics.jsonl")"
done
grep -q '"event":"start","attempt":1' "$work/run_2/events.jsonl" && check "the diverged run was restarted: $(cat "$work/run_2/events.jsonl")"
STRATA_PLUGIN_PATH=$plugins "$strata" run "$work/strategy.toml" --out "$work/continue" "${small[@]}" --set 'job.nonfinite="continue"' \
  > "$work/continue.log" 2>&1 || check "nonfinite = continue did not train on: $(cat "$work/continue.log")"
[[ $fail == 0 ]] && echo "diverged at step 3: stopped with one line and no later checkpoint (1 and 2 ranks); continue trains on"
exit $fail
