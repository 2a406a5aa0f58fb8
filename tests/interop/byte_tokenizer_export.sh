#!/usr/bin/env bash
# byte_tokenizer_export.sh STRATA PYTHON WORKDIR: a run on the byte-level `text` dataset exports
# its tokenizer (issue 62 item 3): transformers' AutoTokenizer reads it, round-trips UTF-8 text
# through exactly the bytes the run trained on, and AutoModelForCausalLM generates from the export.
# Without [data] document_end config.json's bos/eos are null; with it (a newline ends each
# document) both are that byte. `strata sample --temperature 0` continues a prompt with exactly the
# tokens transformers' greedy generate gives on the export, also past seq_len, where both read up
# to the context the model states (the tokenizer's model_max_length too): a GPT trained at 16 of
# its 64 learned positions (its greedy text is one letter repeated, so this shows agreement, not
# the window: unit.Sample does); sampling is repeatable by seed; a run on another dataset is
# refused with exit status 2.
set -uo pipefail
strata=$1 python=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
fail=0
check() { echo "byte_tokenizer_export: $1" >&2; fail=1; }
tiny=(--set job.steps=2 --set job.eval_every=0 --set job.checkpoint_every=2 --set job.threads=1 --set model.n_layer=2 --set model.seq_len=32)
for case in plain newline longer; do
  strategy=examples/strategies/llama_text.toml extra=() tokens=20
  [ $case = newline ] && extra=(--set data.document_end=10)
  [ $case = longer ] && strategy=examples/strategies/default.toml tokens=50 \
    extra=(--disable ddp --set model.d_model=64 --set model.seq_len=16 --set model.max_positions=64 --set optimizer.lr=1e-6)
  "$strata" run $strategy --out "$work/$case" "${tiny[@]}" "${extra[@]}" > "$work/$case.txt" 2>&1 || check "$case: run failed: $(tail -3 "$work/$case.txt")"
  "$strata" ckpt export "$work/$case" "$work/$case-hf" > /dev/null || check "$case: export failed"
  "$python" "$(dirname "$0")/byte_tokenizer_check.py" "$work/$case-hf" "$work/$case-greedy.bin" $tokens || check "$case: transformers check failed"
  "$strata" sample "$work/$case" --prompt "In the" --tokens $tokens --temperature 0 | head -c -1 > "$work/$case-sample.bin" || check "$case: sample failed"
  cmp -s "$work/$case-greedy.bin" "$work/$case-sample.bin" || check "$case: strata sample's greedy text differs from transformers' generate"
done
a=$("$strata" sample "$work/plain" --prompt "In the" --tokens 30 --seed 7 --top-k 8 | od -An -tx1)
b=$("$strata" sample "$work/plain" --prompt "In the" --tokens 30 --seed 7 --top-k 8 | od -An -tx1)
[ -n "$a" ] && [ "$a" = "$b" ] || check "one seed gave two samples"
"$strata" run examples/strategies/fused_loss.toml --out "$work/synthetic" --set model.n_layer=1 --set model.d_model=32 --set model.seq_len=16 --set job.global_batch=2 --set job.steps=1 --set job.threads=1 --set job.eval_every=0 --set job.checkpoint_every=1 > /dev/null 2>&1 || check "synthetic run failed"
msg=$("$strata" sample "$work/synthetic" --prompt "In the" 2>&1); status=$?
[ $status -eq 2 ] && [[ $msg == *"strata sample reads byte-level runs"* ]] || check "a run on token data was not refused with exit 2: $status $msg"
grep -q '"eos_token_id": null' "$work/plain-hf/config.json" || check "without document_end eos is not null"
grep -q '"eos_token_id": 10' "$work/newline-hf/config.json" || check "document_end = 10 is not the eos id"
# The tokenizer's longest input is the model's context: seq_len, or the max_positions it states.
grep -q '"model_max_length": 32' "$work/plain-hf/tokenizer_config.json" || check "model_max_length is not seq_len 32"
grep -q '"model_max_length": 64' "$work/longer-hf/tokenizer_config.json" || check "model_max_length is not max_positions 64"
rm -rf "$work"
exit $fail
