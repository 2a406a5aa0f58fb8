#!/usr/bin/env bash
# graceful_stop_test.sh STRATA STRATEGY WORKDIR [TORCHRUN]
# SIGTERM (a scheduler's preemption) and Ctrl-C stop a run gracefully. Under `strata run -n 2` the
# supervisor asks every rank to stop after one agreed step: the ranks save it and exit, the run
# ends with status 130 and one line saying where it stopped, and resuming it gives the losses of
# the run never stopped, bit for bit. Before, SIGTERM killed the supervisor alone and left mpirun
# and the ranks training with nobody watching, and Ctrl-C by `kill -INT` did nothing. A supervisor
# killed outright (SIGKILL) takes its ranks with it. One process: SIGTERM saves as Ctrl-C does.
# Ranks torchrun started (TORCHRUN given): its agent passes SIGTERM on to them, they agree at
# the next logging step, save it and exit; resumed, the losses are the run's never stopped.
set -uo pipefail
strata=$1 strategy=$2 work=$3 torchrun=${4:-}
rm -rf "$work" && mkdir -p "$work"
fail=0
check() { echo "graceful_stop_test: $1" >&2; fail=1; }
args=(--set job.steps=300 --set job.log_every=50 --set job.checkpoint_every=0 --set job.threads=1)
# The ranks of a run, found by their --out directory on the command line.
ranks_of() { pgrep -f -- "--out $1( |$)" | grep -vx "$2" || true; }
started() { for _ in $(seq 300); do [ -s "$1/metrics.jsonl" ] && return 0; sleep 0.1; done; return 1; }

"$strata" run -n 2 "$strategy" "${args[@]}" --out "$work/stopped" > "$work/stopped.log" 2>&1 &
pid=$!
started "$work/stopped" || check "the run did not start"
kill -TERM $pid
wait $pid; status=$?
[ $status -eq 130 ] || check "exit $status after SIGTERM, expected 130: $(cat "$work/stopped.log")"
step=$(sed -nE 's/^strata: stopping: every rank stops after step ([0-9]+) and saves it.*/\1/p' "$work/stopped.log")
[ -n "$step" ] || check "no stopping line: $(cat "$work/stopped.log")"
grep -q "^strata: interrupted at step $step (newest checkpoint: step $step); continue with \`strata run -n 2 $work/stopped/strategy.toml --out $work/stopped --resume\`$" "$work/stopped.log" ||
  check "no interrupted line at step $step: $(cat "$work/stopped.log")"
grep -q "^Primary job\|^mpirun" "$work/stopped.log" && check "mpirun's report of the ranks' exit is shown: $(cat "$work/stopped.log")"
[ -d "$work/stopped/checkpoints/step_$(printf %08d "$step")" ] || check "no checkpoint of step $step"
[ -z "$(ranks_of "$work/stopped" $pid)" ] || check "processes left after the stop: $(ranks_of "$work/stopped" $pid)"
"$strata" run -n 2 "$work/stopped/strategy.toml" --out "$work/stopped" --resume > "$work/resumed.log" 2>&1 || check "the resume failed: $(tail -3 "$work/resumed.log")"
"$strata" run -n 2 "$strategy" "${args[@]}" --out "$work/whole" > /dev/null 2>&1 || check "the run without a stop failed"
cmp -s <(grep -o '"step":[0-9]*,"loss":[^,]*,"grad_norm":[^,]*' "$work/stopped/metrics.jsonl") \
       <(grep -o '"step":[0-9]*,"loss":[^,]*,"grad_norm":[^,]*' "$work/whole/metrics.jsonl") ||
  check "the stopped and resumed run's losses differ from the run never stopped"

if [ -n "$torchrun" ]; then
  mkdir -p "$work/tmp"
  TMPDIR=$work/tmp OMP_NUM_THREADS=1 "$torchrun" --standalone --nproc-per-node 2 --no-python "$strata" run "$strategy" "${args[@]}" \
    --set job.log_every=10 --out "$work/torchrun" > "$work/torchrun.log" 2>&1 &
  pid=$!
  started "$work/torchrun" || check "the torchrun run did not start"
  kill -TERM $pid
  wait $pid
  step=$(sed -nE 's/^strata: interrupted at step ([0-9]+) of 300 \(checkpoint saved\).*/\1/p' "$work/torchrun.log")
  [ -n "$step" ] && [ "$(grep -c "^strata: interrupted at step" "$work/torchrun.log")" -eq 1 ] ||
    check "torchrun: no single interrupted line: $(grep -v '^step' "$work/torchrun.log" | tail -5)"
  [ -n "$step" ] && [ $((step % 10)) -eq 0 ] && [ -d "$work/torchrun/checkpoints/step_$(printf %08d "$step")" ] ||
    check "torchrun: no checkpoint at a logging step ($step)"
  "$strata" run -n 2 "$work/torchrun/strategy.toml" --out "$work/torchrun" --resume --set job.log_every=50 > "$work/torchrun_resumed.log" 2>&1 ||
    check "torchrun: the resume failed: $(tail -3 "$work/torchrun_resumed.log")"
  cmp -s <(grep -o '"step":[0-9]*,"loss":[^,]*,"grad_norm":[^,]*' "$work/torchrun/metrics.jsonl") \
         <(grep -o '"step":[0-9]*,"loss":[^,]*,"grad_norm":[^,]*' "$work/whole/metrics.jsonl") ||
    check "torchrun: the stopped and resumed run's losses differ from the run never stopped"
fi

# A supervisor killed outright: mpirun gets SIGTERM from the kernel and ends the ranks.
"$strata" run -n 2 "$strategy" "${args[@]}" --set job.steps=100000 --out "$work/killed" > "$work/killed.log" 2>&1 &
pid=$!
started "$work/killed" || check "the second run did not start"
kill -KILL $pid
wait $pid 2>/dev/null
for _ in $(seq 100); do [ -z "$(ranks_of "$work/killed" $pid)" ] && break; sleep 0.1; done
[ -z "$(ranks_of "$work/killed" $pid)" ] || { check "ranks left training after the supervisor was killed"; pkill -KILL -f -- "--out $work/killed"; }

# One process: SIGTERM stops before the next step and saves it, as Ctrl-C does.
"$strata" run "$strategy" "${args[@]}" --set job.steps=100000 --disable ddp --out "$work/single" > "$work/single.log" 2>&1 &
pid=$!
started "$work/single" || check "the single-process run did not start"
kill -TERM $pid
wait $pid; status=$?
[ $status -eq 130 ] && grep -q "^strata: interrupted at step [0-9]* of 100000 (checkpoint saved)" "$work/single.log" ||
  check "one process: exit $status after SIGTERM: $(tail -2 "$work/single.log")"
exit $fail
