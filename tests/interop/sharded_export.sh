#!/usr/bin/env bash
# sharded_export.sh STRATA PYTHON WORKDIR: `strata ckpt export --max-shard-size` splits the weights
# as transformers' save_pretrained does (model-0000i-of-0000N.safetensors, model.safetensors.index.json).
# For a Llama (fp32) and a GPT (bf16: its Conv1D weights are transposed views, cast as written)
# transformers loads the split export with the same tensors and logits as the one-file export;
# `strata sample` continues a prompt alike from both; [model] init_from trains from the split one
# to the same loss as from the other; exporting again into a directory with the other form leaves
# no file of the old one; a re-export killed between two weight files leaves the previous export
# as it was (it is staged in a hidden directory, moved in whole); a size that is no size is
# refused with exit 2.
set -uo pipefail
strata=$1 python=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
fail=0
check() { echo "sharded_export: $1" >&2; fail=1; }
tiny=(--set job.steps=2 --set job.eval_every=0 --set job.checkpoint_every=2 --set job.threads=1 --set model.n_layer=2 --set model.seq_len=32)
"$strata" run examples/strategies/llama_text.toml --out "$work/llama" "${tiny[@]}" > "$work/llama.log" 2>&1 || check "llama run failed: $(tail -3 "$work/llama.log")"
"$strata" run examples/strategies/default.toml --out "$work/gpt" --disable ddp --set model.d_model=64 "${tiny[@]}" > "$work/gpt.log" 2>&1 ||
  check "gpt run failed: $(tail -3 "$work/gpt.log")"
for model in llama:fp32 gpt:bf16; do
  run=${model%:*} dtype=${model#*:}
  "$strata" ckpt export "$work/$run" "$work/$run.one" --dtype $dtype > /dev/null || check "$run: export failed"
  "$strata" ckpt export "$work/$run" "$work/$run.split" --dtype $dtype --max-shard-size 40KiB > "$work/$run.split.log" || check "$run: split export failed"
  files=$(ls "$work/$run.split" | grep -c '^model-000[0-9][0-9]-of-000[0-9][0-9]\.safetensors$')
  [[ $files -gt 2 && -f $work/$run.split/model.safetensors.index.json && ! -e $work/$run.split/model.safetensors ]] ||
    check "$run: not split: $(ls "$work/$run.split")"
  grep -q "($files weight files with model.safetensors.index.json in $dtype, config.json" "$work/$run.split.log" || check "$run: the export's line: $(cat "$work/$run.split.log")"
  "$python" - "$work/$run.one" "$work/$run.split" "$dtype" <<'PY' || check "$run: transformers does not load the split export as the other"
import json, sys, torch
from transformers import AutoModelForCausalLM
one, split, dtype = sys.argv[1], sys.argv[2], sys.argv[3]
a = AutoModelForCausalLM.from_pretrained(one).eval()
b = AutoModelForCausalLM.from_pretrained(split).eval()
wanted = torch.float32 if dtype == "fp32" else torch.bfloat16
sa, sb = a.state_dict(), b.state_dict()
assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa), "tensors differ"
assert all(t.dtype == wanted for t in sb.values() if t.is_floating_point()), "dtype"
index = json.load(open(split + "/model.safetensors.index.json"))
from safetensors import safe_open
stored = 0
for file in sorted(set(index["weight_map"].values())):
    with safe_open(split + "/" + file, "pt") as f:
        stored += sum(f.get_tensor(k).numel() * f.get_tensor(k).element_size() for k in f.keys())
assert index["metadata"]["total_size"] == stored, "total_size"
ids = torch.tensor([[73, 110, 32, 116, 104, 101]])
with torch.no_grad():
    assert torch.equal(a(ids).logits, b(ids).logits), "logits differ"
PY
  a=$("$strata" sample "$work/$run.one" --prompt "In the" --tokens 12 --temperature 0 2> /dev/null | od -An -tx1)
  b=$("$strata" sample "$work/$run.split" --prompt "In the" --tokens 12 --temperature 0 2> /dev/null | od -An -tx1)
  [[ -n $a && $a == "$b" ]] || check "$run: strata sample differs on the split export: '$a' '$b'"
done
for from in one split; do
  "$strata" run examples/strategies/llama_text.toml --out "$work/from_$from" "${tiny[@]}" --set job.steps=1 --set "model.init_from=\"$work/llama.$from\"" \
    > "$work/from_$from.log" 2>&1 || check "init_from the $from export failed: $(tail -3 "$work/from_$from.log")"
done
[[ $(grep -o '"loss":[^,]*' "$work/from_one/metrics.jsonl") == $(grep -o '"loss":[^,]*' "$work/from_split/metrics.jsonl") ]] ||
  check "init_from trains to another loss from the split export"
# Again into the same directories, each in the other form: no file of the old form is left.
"$strata" ckpt export "$work/llama" "$work/llama.split" > /dev/null && "$strata" ckpt export "$work/llama" "$work/llama.one" --max-shard-size 40KiB > /dev/null ||
  check "exporting again failed"
[[ $(ls "$work/llama.split" | grep -c '^model') == 1 && -f $work/llama.split/model.safetensors ]] || check "split files left: $(ls "$work/llama.split")"
[[ ! -e $work/llama.one/model.safetensors && -f $work/llama.one/model.safetensors.index.json ]] || check "one file left: $(ls "$work/llama.one")"
# Killed after its first weight file: the export there before is untouched, and the next one clears the staging.
before=$(cd "$work/llama.split" && sha256sum * | sort)
STRATA_FAULT="kill_in_export 0 0" "$strata" ckpt export "$work/llama" "$work/llama.split" --dtype bf16 --max-shard-size 40KiB > /dev/null 2>&1
status=$?
[[ $status == 137 && $(cd "$work/llama.split" && sha256sum * | sort) == "$before" ]] ||
  check "a killed re-export (status $status) changed the export before it: $(ls -a "$work/llama.split")"
"$strata" ckpt export "$work/llama" "$work/llama.split" --max-shard-size 40KiB > /dev/null || check "exporting after a killed export failed"
[[ ! -e $work/llama.split/.strata-export.tmp && ! -e $work/llama.split/model.safetensors && -f $work/llama.split/model.safetensors.index.json ]] ||
  check "after a killed export: $(ls -a "$work/llama.split")"
msg=$("$strata" ckpt export "$work/llama" "$work/bad" --max-shard-size 5XB 2>&1); status=$?
[[ $status == 2 && $msg == "strata: error: --max-shard-size expects a size such as 5GB, 500MB or 2GiB (or bytes), got '5XB'" ]] ||
  check "a bad size: status $status, $msg"
[[ $fail == 0 ]] && rm -rf "$work" && echo "split exports load, sample and initialize as one-file exports"
exit $fail
