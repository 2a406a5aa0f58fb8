#!/usr/bin/env bash
# torchrun_restart_test.sh TORCHRUN WORKDIR COMMAND...
# torchrun --max-restarts as the supervisor of COMMAND (`strata run`, or a program on the library
# API), whose arguments name its run directory as the word RUN_DIR (replaced here): a rank killed
# at step 6 takes its worker group down, torchelastic restarts the group, and the restarted ranks
# resume from the newest checkpoint (step 4), though the command asks for no resume; the run
# completes with every step's loss equal (bit for bit) to an uninterrupted run's.
set -euo pipefail
torchrun=$1 work=$2
shift 2
rm -rf "$work" && mkdir -p "$work/tmp"
export TMPDIR="$work/tmp"  # torchrun's agent keeps its logs in a fresh TMPDIR/torchelastic_* directory
launch=("$torchrun" --standalone --nproc-per-node 2 --no-python)
command_for() { local arg; for arg in "${@:2}"; do printf '%s\0' "${arg//RUN_DIR/$work/$1}"; done; }
mapfile -d '' whole < <(command_for whole "$@")
mapfile -d '' restarted < <(command_for restarted "$@")
OMP_NUM_THREADS=1 "${launch[@]}" "${whole[@]}" > "$work/whole.log" 2>&1 || { cat "$work/whole.log"; exit 1; }
STRATA_FAULT="kill 1 6" OMP_NUM_THREADS=1 "${launch[@]}" --max-restarts 1 "${restarted[@]}" > "$work/restarted.log" 2>&1 ||
  { cat "$work/restarted.log"; exit 1; }
grep -q "resumed from .*step_00000004 at step 4" "$work/restarted.log" ||
  { echo "the restarted group did not resume from step 4"; cat "$work/restarted.log"; exit 1; }
losses() { sed -E 's/.*"step":([0-9]+),"loss":([^,]+),.*/\1 \2/' "$1/metrics.jsonl"; }
diff <(losses "$work/whole") <(losses "$work/restarted") || { echo "the restarted run's losses differ"; exit 1; }
echo "torchrun restarted the worker group after the kill; it resumed at step 4 and matched the uninterrupted run for $(losses "$work/whole" | wc -l) steps"
