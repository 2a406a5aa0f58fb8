#!/usr/bin/env bash
# resume_test.sh STRATA STRATEGY WORKDIR [RANKS [EXTRA --set ...]]
# (RESUME_DROPOUT=none: for models without a dropout key)
# Trains 12 steps uninterrupted; then "interrupts" a copy after its step-4 checkpoint (removing
# the later ones), corrupts one later checkpoint in a second copy, resumes both, and requires
# every step's metrics (all but timings and peak memory) to equal the uninterrupted run's, bit
# for bit. The ranks share the checksums: each file is hashed by one rank.
set -euo pipefail
strata=$1 strategy=$2 work=$3 ranks=${4:-1}
shift $(( $# < 4 ? $# : 4 ))
run() { "$strata" run -n "$ranks" "$@"; }
rm -rf "$work" && mkdir -p "$work"
small=(--set job.steps=12 --set job.checkpoint_every=4 --set job.eval_every=6 --set job.log_every=4
       --set job.global_batch=4 --set job.micro_batch=2 --set job.threads=1
       --set model.n_layer=1 --set model.seq_len=32 "$@")
[[ ${RESUME_DROPOUT:-} == none ]] || small+=(--set model.dropout=0.1)
run "$strategy" --out "$work/full" "${small[@]}"
# Every metric but timings, peak memory and host reads (a resumed pipeline reads its messages'
# headers again in its first step): losses, gradient norms, learning rates, validation losses and
# what passes report (e.g. amp's loss scale) must all continue exactly.
losses() { sed -E 's/"[a-z_]*_ms":[^,}]*,?//g; s/"mem_(device_)?peak_bytes":[^,}]*,?//g; s/"pp_idle_fraction_stage[0-9]*":[^,}]*,?//g; s/"host_reads":[^,}]*,?//g' "$1"; }

cp -r "$work/full" "$work/cut"
rm -rf "$work/cut/checkpoints/step_00000008" "$work/cut/checkpoints/step_00000012"
run "$work/cut/strategy.toml" --out "$work/cut" --resume | tee "$work/cut.log"
grep -q "resumed from .*step_00000004 at step 4" "$work/cut.log"
diff <(losses "$work/full/metrics.jsonl") <(losses "$work/cut/metrics.jsonl")
# The ranks verify the checksums together: each of the checkpoint's files is hashed by one rank.
hashed=$(grep -ho "this rank hashed [0-9]* of the $ranks files" "$work"/cut/logs/rank_*.log | awk '{s += $4} END {print s + 0}')
[ "$hashed" = "$ranks" ] || { echo "the ranks hashed $hashed of step 4's $ranks files between them, not each file once"; exit 1; }

cp -r "$work/full" "$work/corrupt"
rm -rf "$work/corrupt/checkpoints/step_00000012"
# The last rank's file: the rank that hashes it is not the one that prints, and all fall back.
damaged=$(printf 'rank_%05d.safetensors' $((ranks - 1)))
printf 'XXXX' | dd of="$work/corrupt/checkpoints/step_00000008/$damaged" bs=1 seek=100 conv=notrunc 2>/dev/null
run "$work/corrupt/strategy.toml" --out "$work/corrupt" --resume > "$work/corrupt.log" 2>&1
grep -q "skipping checkpoint .*step_00000008: $damaged fails its SHA-256 checksum" "$work/corrupt.log"
grep -q "resumed from .*step_00000004 at step 4" "$work/corrupt.log"
diff <(losses "$work/full/metrics.jsonl") <(losses "$work/corrupt/metrics.jsonl")
echo "resume on $ranks rank(s): 12 losses identical after interruption and after skipping a corrupt checkpoint"
