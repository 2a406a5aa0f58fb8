#!/usr/bin/env bash
# torchrun_library_restart_test.sh TORCHRUN PROGRAM STRATEGY WORKDIR
# A program on the library API (sdk/examples' train_mlp_lm) under torchrun --max-restarts, as
# `strata run` is in torchrun_restart_test.sh: a rank killed at step 6 takes the worker group down,
# torchelastic restarts the program, and its Trainer continues from the newest checkpoint (step 4)
# though the program asks for no resume; every step's loss equals an uninterrupted run's.
set -euo pipefail
torchrun=$1 program=$2 strategy=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
launch=("$torchrun" --standalone --nproc-per-node 2 --no-python)
settings=(job.steps=12 job.checkpoint_every=4)
OMP_NUM_THREADS=1 "${launch[@]}" "$program" "$strategy" job.run_dir="$work/whole" "${settings[@]}" > "$work/whole.log" 2>&1 ||
  { cat "$work/whole.log"; exit 1; }
STRATA_FAULT="kill 1 6" OMP_NUM_THREADS=1 "${launch[@]}" --max-restarts 1 "$program" "$strategy" job.run_dir="$work/restarted" \
  "${settings[@]}" > "$work/restarted.log" 2>&1 || { cat "$work/restarted.log"; exit 1; }
grep -q "resumed from .*step_00000004 at step 4" "$work/restarted.log" ||
  { echo "the restarted program did not resume from step 4"; cat "$work/restarted.log"; exit 1; }
losses() { sed -E 's/.*"step":([0-9]+),"loss":([^,]+),.*/\1 \2/' "$1/metrics.jsonl"; }
diff <(losses "$work/whole") <(losses "$work/restarted") || { echo "the restarted program's losses differ"; exit 1; }
echo "torchrun restarted the library program after the kill; it resumed at step 4 and matched the uninterrupted run for $(losses "$work/whole" | wc -l) steps"
