#!/usr/bin/env bash
# The run's lifecycle speaks (issue 62, item 6): a start line naming the run directory, world and
# strategy; a closing line with the loss and how to report, export and train on; Ctrl-C in a
# single process stops before the next step, saves it, says how to continue, exits 130, and the
# continued run resumes from that step. The saved strategy.toml reruns from any directory: a run
# started here with relative [data] path and [model] init_from resumes, exports and samples from
# another working directory (the plan holds those paths absolute), even with the init_from weights deleted.
#   lifecycle_test.sh STRATA STRATEGY WORK_DIR
set -euo pipefail
strata=$1 strategy=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
small=(--set job.eval_every=0 --set job.threads=1 --set job.global_batch=4 --set model.n_layer=1 --set model.seq_len=32)
"$strata" run "$strategy" --out "$work/done" "${small[@]}" --set job.steps=3 > "$work/done.log"
grep -q "^strata: training in $work/done: world 1 (data 1 x tensor 1 x pipeline 1 x context 1), strategy $strategy, 3 steps$" "$work/done.log" \
  || { echo "FAIL: no start line"; cat "$work/done.log"; exit 1; }
grep -Eq "^strata: done: step 3, loss [0-9.]+; checkpoint in $work/done/checkpoints; .strata report $work/done. .*strata ckpt export $work/done DIR.*strata run $work/done/strategy.toml --out $work/done --resume --set job.steps=N" "$work/done.log" \
  || { echo "FAIL: no closing line"; cat "$work/done.log"; exit 1; }
# Resuming a finished run trains nothing and says so (it said "done: step 3, loss 0").
"$strata" run "$work/done/strategy.toml" --out "$work/done" --resume > "$work/again.log"
grep -q "^strata: done: the checkpoint of step 3 ends the run (\[job\] steps = 3); nothing was trained; checkpoint in $work/done/checkpoints" \
  "$work/again.log" || { echo "FAIL: the resume of a finished run"; cat "$work/again.log"; exit 1; }
# Ctrl-C: a long run, interrupted once it has started stepping.
"$strata" run "$strategy" --out "$work/long" "${small[@]}" --set job.steps=1000000 --set job.checkpoint_every=0 > "$work/long.log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do [ -s "$work/long/metrics.jsonl" ] && break; sleep 0.1; done
kill -INT $pid
set +e; wait $pid; status=$?; set -e
[ "$status" = 130 ] || { echo "FAIL: exit $status after Ctrl-C, expected 130"; cat "$work/long.log"; exit 1; }
line=$(grep "^strata: interrupted at step" "$work/long.log") || { echo "FAIL: no interrupted line"; cat "$work/long.log"; exit 1; }
step=$(echo "$line" | sed -E 's/^strata: interrupted at step ([0-9]+) of.*/\1/')
echo "$line" | grep -q "(checkpoint saved); continue with .strata run $work/long/strategy.toml --out $work/long --resume." \
  || { echo "FAIL: $line"; exit 1; }
[ "$(tail -1 "$work/long/metrics.jsonl" | sed -E 's/^\{"step":([0-9]+),.*/\1/')" = "$step" ] || { echo "FAIL: metrics do not end at step $step"; exit 1; }
"$strata" run "$work/long/strategy.toml" --out "$work/long" --resume --set job.steps=$((step + 1)) > "$work/resume.log" 2>&1 \
  || { cat "$work/resume.log"; exit 1; }
grep -q "resumed from .*step_0*$step at step $step" "$work/resume.log" || { echo "FAIL: not resumed at $step"; cat "$work/resume.log"; exit 1; }
# An export or consolidated file inside the run directory (which a --resume would then refuse) is
# refused in one line, and the run still resumes.
for out in "$work/long" "$work/long/hf" "$work/long/checkpoints/step_00000001"; do
  set +e; msg=$("$strata" ckpt export "$work/long" "$out" 2>&1); status=$?; set -e
  [ $status -eq 2 ] && [[ $msg == "strata: error: the export directory $out is inside the "* ]] || { echo "FAIL: export into $out: $status $msg"; exit 1; }
done
set +e; msg=$("$strata" ckpt consolidate "$work/long" "$work/long/all.safetensors" 2>&1); status=$?; set -e
[ $status -eq 2 ] && [[ $msg == *"is inside the run directory $work/long, "* ]] || { echo "FAIL: consolidate into the run: $status $msg"; exit 1; }
"$strata" run "$work/long/strategy.toml" --out "$work/long" --resume --set job.steps=$((step + 2)) > "$work/resume2.log" 2>&1 \
  || { echo "FAIL: resume after the refused exports"; cat "$work/resume2.log"; exit 1; }
# Relative paths, then another working directory.
"$strata" ckpt export "$work/done" "$work/exported" > /dev/null
relative=$(realpath --relative-to=. "$work/exported")
"$strata" run "$strategy" --out "$work/relative" "${small[@]}" --set job.steps=2 --set "model.init_from=$relative" > "$work/relative.log"
grep -q "^path = \"$(pwd)/data/kjv.txt\"$" "$work/relative/strategy.toml" && grep -q "^init_from = \"$work/exported\"$" "$work/relative/strategy.toml" \
  || { echo "FAIL: the saved strategy keeps relative paths"; grep -E "^(path|init_from) =" "$work/relative/strategy.toml"; exit 1; }
mkdir -p "$work/elsewhere"
# The weights it started from are gone: a resume takes every weight from its checkpoint.
rm -r "$work/exported"
(cd "$work/elsewhere" && "$strata" run "$work/relative/strategy.toml" --out "$work/relative" --resume --set job.steps=3 > "$work/elsewhere.log" 2>&1 &&
  "$strata" ckpt export "$work/relative" "$work/elsewhere/hf" > /dev/null && "$strata" sample "$work/relative" --prompt "In the" --tokens 4 > "$work/sample.log") \
  || { echo "FAIL: the saved strategy does not rerun from another directory"; cat "$work/elsewhere.log"; exit 1; }
grep -q "resumed from .*step_0*2 at step 2" "$work/elsewhere.log" && test -s "$work/elsewhere/hf/model.safetensors" && grep -q "^In the" "$work/sample.log" \
  || { echo "FAIL: resume, export or sample from another directory"; cat "$work/elsewhere.log" "$work/sample.log"; exit 1; }
echo "OK: start and closing lines; Ctrl-C at step $step saved it and the run continued from there; the saved strategy reruns from elsewhere"
