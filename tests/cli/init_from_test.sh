#!/usr/bin/env bash
# init_from_test.sh STRATA STRATEGY WORKDIR
# Trains briefly, exports the checkpoint in Hugging Face layout, and starts a new run from it
# with [model] init_from: its first loss must be the trained model's, far below a fresh start's,
# also at a shorter context (the first rows of GPT-2's learned positions, the table kept whole or cut).
set -euo pipefail
strata=$1 strategy=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
small=(--set job.global_batch=8 --set job.threads=1 --set job.eval_every=0 --set model.n_layer=1 --set model.seq_len=64)
"$strata" run "$strategy" --out "$work/train" --set job.steps=40 --set optimizer.warmup_steps=5 "${small[@]}" > /dev/null
"$strata" ckpt export "$work/train" "$work/hf"
test -s "$work/hf/model.safetensors" && grep -q GPT2LMHeadModel "$work/hf/config.json"
"$strata" run "$strategy" --out "$work/again" --set job.steps=1 --set "model.init_from=$work/hf" "${small[@]}" > /dev/null
first() { sed -n '1s/.*"loss":\([^,]*\),.*/\1/p' "$1"; }
fresh=$(first "$work/train/metrics.jsonl") resumed=$(first "$work/again/metrics.jsonl")
echo "first loss: fresh $fresh, from the exported weights $resumed"
awk -v a="$resumed" -v b="$fresh" 'BEGIN { exit !(a < b - 1.0) }'
# A shorter context (seq_len 32 of the export's 64 positions) trains on the first learned
# positions, keeping all 64 ([model] max_positions = 64: its export states n_positions 64) or
# only the 32 (max_positions = 32); the first losses are the same.
"$strata" run "$strategy" --out "$work/shorter" --set job.steps=1 --set "model.init_from=$work/hf" "${small[@]}" --set model.seq_len=32 \
  --set model.max_positions=64 > /dev/null
"$strata" run "$strategy" --out "$work/cropped" --set job.steps=1 --set "model.init_from=$work/hf" "${small[@]}" --set model.seq_len=32 \
  --set model.max_positions=32 > /dev/null
shorter=$(first "$work/shorter/metrics.jsonl") cropped=$(first "$work/cropped/metrics.jsonl")
echo "first loss at seq_len 32 from the 64-position export: $shorter (all 64 positions kept), $cropped (the first 32)"
awk -v a="$shorter" -v b="$fresh" 'BEGIN { exit !(a < b - 1.0) }'
[ "$shorter" = "$cropped" ] || { echo "FAIL: keeping the table changed the loss"; exit 1; }
"$strata" ckpt export "$work/shorter" "$work/shorter.hf" > /dev/null
"$strata" ckpt export "$work/cropped" "$work/cropped.hf" > /dev/null
grep -q '"n_positions": 64,' "$work/shorter.hf/config.json" && grep -q '"n_positions": 32,' "$work/cropped.hf/config.json" ||
  { echo "FAIL: the exports do not state their tables"; exit 1; }
