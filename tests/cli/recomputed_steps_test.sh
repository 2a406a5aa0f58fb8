#!/usr/bin/env bash
# recomputed_steps_test.sh STRATA STRATEGY WORKDIR
# A rank killed by a signal cannot write the metrics lines of the steps it has not read yet
# ([job] log_every = 4 defers them): the supervisor takes the steps reached from the ranks'
# progress records instead. Rank 1 is killed as step 3 starts, with no checkpoint on disk: steps
# 1 and 2 were done and are run again, and the failure and finish events say so (they said 0).
set -euo pipefail
strata=$1 strategy=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
STRATA_FAULT="kill 1 3" "$strata" run -n 2 "$strategy" --out "$work/run" --set job.log_every=4 --set job.checkpoint_every=0 \
  --set job.max_restarts=1 --set job.restart_backoff=0 > "$work/run.log" 2>&1 || { cat "$work/run.log"; exit 1; }
events="$work/run/events.jsonl"
grep -q '"event":"failure".*"step_reached":2,"checkpoint_step":0,"steps_lost":2' "$events" || { cat "$events"; exit 1; }
grep -q '"event":"finish".*"restarts":1,"recomputed_steps":2,' "$events" || { cat "$events"; exit 1; }
# The ranks that found no checkpoint say they resumed at step 0 (the supervisor estimated it from
# the first step it saw running, steps later for a fast job).
grep -q '"event":"recovered".*"resumed_step":0,"sources":\["none","none"\]' "$events" || { cat "$events"; exit 1; }
grep -q "rank 1 exited on signal 9 (Killed) at step 2; restarting all ranks from step 0" "$work/run.log" || { cat "$work/run.log"; exit 1; }
echo "killed at step 3 with steps 1-2 unlogged: step_reached 2, 2 steps recomputed"
rm -rf "$work"
