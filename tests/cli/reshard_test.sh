#!/usr/bin/env bash
# reshard_test.sh STRATA STRATEGY WORKDIR FROM_RANKS FROM_PASS TO_RANKS TO_PASS [EXTRA --set ...]
# Trains 12 steps on FROM_RANKS ranks with FROM_PASS (ddp, zero1, zero2, fsdp, none for one
# process without passes, or tpN for [parallel] tensor = N with a strategy that enables
# tensor_parallel; ppN for [parallel] pipeline = N with pipeline.toml, pp1 without the pass;
# tp2+on-fsdp adds a pass the strategy lists disabled; epN for [parallel] expert = N with
# mixtral.toml; hsdpN for fsdp with shard_size = N), checkpointing every 4; keeps only the step-4 checkpoint and resumes it
# on TO_RANKS ranks with TO_PASS. Every later step's loss must match the uninterrupted run within
# a relative 1e-5 (the tolerance of data-parallel parity: the sums run in another order), or
# $RESHARD_TOLERANCE (fp8, whose roundings amplify another summation order).
set -euo pipefail
strata=$1 strategy=$2 work=$3 from_ranks=$4 from_pass=$5 to_ranks=$6 to_pass=$7
shift 7
pass_flags() {
  if [[ $1 == *+* ]]; then pass_flags "${1%%+*}"; pass_flags "${1#*+}"; return; fi  # tp2+fsdp: both
  case $1 in
    ddp) ;;
    none) echo --disable ddp ;;
    tp*) echo --set "parallel.tensor=${1#tp}" ;;  # tensor parallel at that size (tensor_parallel.toml)
    pp1) echo --set parallel.pipeline=1 --disable pipeline_parallel ;;  # one stage (pipeline.toml)
    pp*) echo --set "parallel.pipeline=${1#pp}" ;;  # pipeline parallel at that size (pipeline.toml)
    on-*) echo --set "pass.${1#on-}.enabled=true" ;;  # a pass the strategy lists disabled
    ep*) echo --set "parallel.expert=${1#ep}" --set pass.expert_parallel.enabled=true ;;  # expert parallel (mixtral.toml)
    hsdp*) echo --disable ddp --set pass.fsdp.enabled=true --set "pass.fsdp.shard_size=${1#hsdp}" ;;  # fsdp in shard groups of N
    *) echo --disable ddp --set "pass.$1.enabled=true" ;;
  esac
}
common=(--set job.steps=12 --set job.checkpoint_every=4 --set job.keep_checkpoints=3 --set job.micro_batch=1 "$@")
rm -rf "$work" && mkdir -p "$work"
"$strata" run -n "$from_ranks" "$strategy" --out "$work/full" $(pass_flags "$from_pass") "${common[@]}" > "$work/full.log" 2>&1 ||
  { cat "$work/full.log"; exit 1; }
cp -r "$work/full" "$work/cut"
rm -rf "$work/cut/checkpoints/step_00000008" "$work/cut/checkpoints/step_00000012"
"$strata" run -n "$to_ranks" "$strategy" --out "$work/cut" --resume $(pass_flags "$to_pass") "${common[@]}" > "$work/cut.log" 2>&1 ||
  { cat "$work/cut.log"; exit 1; }
grep -q "resumed from .*step_00000004 at step 4" "$work/cut.log" || { cat "$work/cut.log"; exit 1; }
"$(dirname "$0")/same_losses.sh" --after 4 "$from_pass@$from_ranks -> $to_pass@$to_ranks, resumed at step 4" "${RESHARD_TOLERANCE:-1e-5}" 8 \
  "$work/full" "$work/cut"
