#!/usr/bin/env bash
# checkpoint_at_end_test.sh STRATA WORKDIR: [job] checkpoint_at_end = false writes no checkpoint at
# the end, in one process and under flash checkpoints (the supervisor persists nothing when the run
# ends well), says so in its last line, and still writes the periodic ones (checkpoint_every).
set -uo pipefail
strata=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
fail=0
check() { echo "checkpoint_at_end_test: $1" >&2; fail=1; }
tiny=(--set job.steps=3 --set job.global_batch=4 --set job.threads=1 --set job.eval_every=0 --set model.n_layer=1 --set model.d_model=16
      --set model.n_head=2 --set model.seq_len=16 --set job.checkpoint_at_end=false)
"$strata" run examples/strategies/single_process.toml --out "$work/one" "${tiny[@]}" > "$work/one.txt" 2>&1 || check "one process failed: $(tail -3 "$work/one.txt")"
[ ! -e "$work/one/checkpoints" ] || check "one process wrote a checkpoint"
grep -q "no checkpoint at the end (\[job\] checkpoint_at_end = false)" "$work/one.txt" || check "the last line names a checkpoint: $(tail -1 "$work/one.txt")"
"$strata" run -n 2 examples/strategies/fsdp.toml --out "$work/flash" "${tiny[@]}" --set job.flash_every=1 > "$work/flash.txt" 2>&1 ||
  check "flash run failed: $(tail -3 "$work/flash.txt")"
[ ! -e "$work/flash/checkpoints" ] || check "the supervisor persisted a snapshot at the end"
"$strata" run -n 2 examples/strategies/fsdp.toml --out "$work/periodic" "${tiny[@]}" --set job.steps=4 --set job.checkpoint_every=2 > "$work/periodic.txt" 2>&1 ||
  check "periodic run failed: $(tail -3 "$work/periodic.txt")"
[ -d "$work/periodic/checkpoints/step_00000002" ] || check "checkpoint_every = 2 wrote no step 2 with checkpoint_at_end = false"
[ $fail -eq 0 ] && rm -rf "$work"
exit $fail
