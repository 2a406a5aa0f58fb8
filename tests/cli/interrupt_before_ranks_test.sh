#!/usr/bin/env bash
# interrupt_before_ranks_test.sh STRATA TOML DIR: a SIGTERM that reaches `strata run -n 2` before
# its ranks start (here: pending when it starts, as a launcher that blocked it leaves it) ends it
# with one line and status 130, starts no rank and writes no checkpoint. Before, one in that window
# ended it silently with status 143, and one pending at start was never seen (the run trained).
set -u
strata=$1 toml=$2 dir=$3
rm -rf "$dir"
python=python3
out=$("$python" - "$strata" "$toml" "$dir" <<'PY' 2>&1
import os, signal, sys
strata, toml, out = sys.argv[1:]
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
os.kill(os.getpid(), signal.SIGTERM)  # pending, and kept pending across exec
os.execv(strata, [strata, "run", "-n", "2", toml, "--out", out, "--set", "job.steps=2"])
PY
)
status=$?
fail=0
[ $status -eq 130 ] || { echo "interrupt_before_ranks_test: status $status, not 130: $out" >&2; fail=1; }
[ "$(grep -c "interrupted before the ranks started" <<<"$out")" -eq 1 ] || { echo "interrupt_before_ranks_test: not one line saying so: $out" >&2; fail=1; }
[ ! -e "$dir/checkpoints" ] && [ ! -e "$dir/metrics.jsonl" ] || { echo "interrupt_before_ranks_test: a rank ran: $(ls "$dir")" >&2; fail=1; }
exit $fail
