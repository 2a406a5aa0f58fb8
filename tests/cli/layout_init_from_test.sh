#!/usr/bin/env bash
# layout_init_from_test.sh STRATA STRATEGY WORKDIR -- ONE_PROCESS_ARGS... -- LAYOUT_ARGS...
# [model] init_from under a layout (pipeline, tensor x pipeline, ...): weights trained briefly
# from another seed in one process are exported in Hugging Face layout; the run starting from
# them in one process (ONE_PROCESS_ARGS) and the run under the layout (LAYOUT_ARGS, with its -n)
# agree at every step within 2e-6 relative, and their first loss lies far below a fresh start's.
# A checkpoint tensor of a block another pipeline rank holds is that rank's, not an error (a
# regression once refused lm_head.weight on the ranks without the head). LAYOUT_LOG_MATCH, when set,
# is a pattern the layout run's rank 0 log must hold (fsdp: that it kept its shards as it loaded).
set -euo pipefail
strata=$1 strategy=$2 work=$3
shift 3
[[ $1 == -- ]] || { echo "usage: layout_init_from_test.sh STRATA STRATEGY WORKDIR -- ONE... -- LAYOUT..." >&2; exit 2; }
shift
one=() layout=()
while [[ $# -gt 0 && $1 != -- ]]; do one+=("$1"); shift; done
shift
layout=("$@")
rm -rf "$work" && mkdir -p "$work"
"$strata" run "$strategy" "${one[@]}" --out "$work/source" --set job.seed=7 --set job.steps=30 --set job.eval_every=0 \
  --set optimizer.lr=1e-2 > "$work/source.log" 2>&1 || { cat "$work/source.log"; exit 1; }
"$strata" ckpt export "$work/source" "$work/hf" > /dev/null
"$(dirname "$0")/compare_runs.sh" "$strata" "$work/runs" same 2e-6 \
  -- "$strategy" "${one[@]}" --set "model.init_from=$work/hf" \
  -- "$strategy" "${layout[@]}" --set "model.init_from=$work/hf"
if [[ -n ${LAYOUT_LOG_MATCH:-} ]]; then
  grep -q -- "$LAYOUT_LOG_MATCH" "$work/runs/b/logs/rank_0.log" || { echo "rank 0's log lacks $LAYOUT_LOG_MATCH"; exit 1; }
fi
first() { sed -n '1s/.*"loss":\([^,]*\),.*/\1/p' "$1"; }
fresh=$(first "$work/source/metrics.jsonl") loaded=$(first "$work/runs/b/metrics.jsonl")
echo "first loss: fresh start $fresh, from the exported weights under the layout $loaded"
awk -v a="$loaded" -v b="$fresh" 'BEGIN { exit !(a < b - 1.0) }'
