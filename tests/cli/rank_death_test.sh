#!/usr/bin/env bash
# rank_death_test.sh STRATA STRATEGY WORKDIR
# Kills one rank of a 2-rank run: the whole job must stop within 30 s, naming the dead rank.
set -uo pipefail
strata=$1 strategy=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
"$strata" run -n 2 "$strategy" --out "$work/run" --set job.steps=100000 > "$work/log" 2>&1 &
launcher=$!
for _ in $(seq 100); do
  grep -q "step " "$work/run/logs/rank_1.log" 2>/dev/null && break
  sleep 0.2
done
victim=$(pgrep -f -- "--out $work/run" | sort -n | tail -1)
kill -9 "$victim"
killed_at=$(date +%s)
for _ in $(seq 300); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$launcher" 2>/dev/null; then
  echo "job still running 30 s after rank death"; kill -9 "$launcher"; exit 1
fi
wait "$launcher"; status=$?
echo "job ended $(( $(date +%s) - killed_at )) s after the kill with status $status"
# The supervisor's one line names the rank (mpirun's report around it is not shown).
grep -E "^strata: error: rank [0-9]+ exited on signal 9 \(Killed\)" "$work/log" && ! grep -q "mpirun noticed" "$work/log" ||
  { tail -20 "$work/log"; exit 1; }
[ "$status" -ne 0 ]
