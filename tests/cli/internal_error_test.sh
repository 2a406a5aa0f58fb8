#!/usr/bin/env bash
# internal_error_test.sh STRATA WORKDIR
# An internal error (here a libtorch error with its C++ backtrace, STRATA_FAULT="torch_error")
# is one line on the terminal naming what failed and where the full trace went, on one process
# and on two ranks (reported once), recorded in events.jsonl; the trace is in the rank's log.
set -uo pipefail
strata=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
run=(examples/strategies/default.toml --set job.steps=4 --set job.eval_every=0 --set job.checkpoint_every=0 --set job.threads=1
     --set job.max_restarts=0)
check() {  # check NAME RANK: the run's terminal output, events and log
  local name=$1 rank=$2 out="$work/$1.txt"
  [ "$(grep -c . "$out")" -eq 1 ] || { cat "$out"; fail "$name: the terminal shows more than one line"; }
  grep -Eq "^strata: internal error( \(rank $rank\))?: injected fault: a libtorch error at step 2 \(full trace: .*/$name/logs/rank_$rank\.log\)$" "$out" ||
    { cat "$out"; fail "$name: the line does not name the error and its trace"; }
  grep -q "Exception raised from\|frame #" "$work/$name/logs/rank_$rank.log" || fail "$name: the rank log holds no trace"
  grep -q '"event":"internal_error".*injected fault' "$work/$name/events.jsonl" || fail "$name: no internal_error event"
}
STRATA_FAULT="torch_error 0 2" "$strata" run "${run[@]}" --out "$work/one" > "$work/one_stdout.txt" 2> "$work/one.txt"; status=$?
[ "$status" -eq 1 ] || { cat "$work/one.txt"; fail "one process: exit status $status, wanted 1"; }
check one 0
STRATA_FAULT="torch_error 1 2" "$strata" run -n 2 "${run[@]}" --out "$work/two" > "$work/two_stdout.txt" 2> "$work/two.txt"; status=$?
[ "$status" -eq 1 ] || { cat "$work/two.txt"; fail "two ranks: exit status $status, wanted 1"; }
check two 1
grep -q '"event":"failure".*"cause":"internal error (rank 1): injected fault' "$work/two/events.jsonl" || fail "two ranks: the failure event has no cause"
echo "OK: internal errors are one line, their traces in the rank logs and events.jsonl"
