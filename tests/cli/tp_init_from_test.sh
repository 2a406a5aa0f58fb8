#!/usr/bin/env bash
# tp_init_from_test.sh STRATA STRATEGY WORKDIR RANKS TENSOR [--set ...]
# [model] init_from into a model split over tensor-parallel ranks. Weights trained briefly from
# another seed are exported in Hugging Face layout; runs starting from them at tensor 1 and at
# tensor TENSOR on RANKS ranks must agree at every step within 2e-6 relative (the tolerance of
# the other tensor-parallel parity tests), and their first loss must lie far below a fresh
# start's (the weights were loaded, not drawn). Further arguments go to every run.
set -euo pipefail
strata=$1 strategy=$2 work=$3 ranks=$4 tensor=$5
shift 5
rm -rf "$work" && mkdir -p "$work"
"$strata" run "$strategy" --out "$work/source" --set parallel.tensor=1 --set job.seed=7 --set job.steps=30 \
  --set job.eval_every=0 --set optimizer.lr=1e-2 "$@" > /dev/null
"$strata" ckpt export "$work/source" "$work/hf" > /dev/null
"$(dirname "$0")/compare_runs.sh" "$strata" "$work/runs" same 2e-6 \
  -- "$strategy" --set parallel.tensor=1 --set "model.init_from=$work/hf" "$@" \
  -- "$strategy" -n "$ranks" --set "parallel.tensor=$tensor" --set "model.init_from=$work/hf" "$@"
first() { sed -n '1s/.*"loss":\([^,]*\),.*/\1/p' "$1"; }
fresh=$(first "$work/source/metrics.jsonl") loaded=$(first "$work/runs/b/metrics.jsonl")
echo "first loss: fresh start $fresh, from the exported weights at tensor $tensor $loaded"
awk -v a="$loaded" -v b="$fresh" 'BEGIN { exit !(a < b - 1.0) }'
