#!/usr/bin/env bash
# whole_life.sh STRATA PYTHON WORKDIR
# The newest [model] keys through the whole life of a run, across layouts: a Qwen2-style Llama
# (q/k/v biases) with Llama 3.1's rope scaling and a stated context (max_positions 512) is planned
# and trained 4 steps at tensor 2 with sequence parallel; its saved strategy.toml resumes it on 3
# ranks under fsdp (resharded) to step 6; the export loads in transformers as Qwen2ForCausalLM with
# the llama3 scaling and the stated context, and transformers' greedy continuation is exactly
# `strata sample --temperature 0`'s; the export starts a new run at pipeline 2 from a strategy whose
# [model] names only init_from and seq_len and [job] names no model (every other key taken from
# the export's config.json: the model type, the biases, the scaling, the context), whose first
# loss is the resumed run's model's, far below a fresh start's; its saved strategy resumes it on
# one rank.
set -euo pipefail
strata=$1 python=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
cat > "$work/qwen2.toml" <<EOF
[job]
model = "llama"
dataset = "text"
steps = 4
global_batch = 6
log_every = 2
eval_every = 0
checkpoint_every = 2
threads = 1

[model]
n_layer = 2
n_head = 4
n_kv_head = 2
d_model = 64
ffn_hidden = 96
vocab_size = 256
seq_len = 48
qkv_bias = true
rope_theta = 500000.0
rope_scaling = "llama3"
rope_factor = 8.0
rope_original_context = 32
max_positions = 512

[data]
path = "data/kjv.txt"

[optimizer]
lr = 3e-3
warmup_steps = 1

[parallel]
tensor = 2

[[pass]]
name = "tensor_parallel"
sequence_parallel = true

[[pass]]
name = "fsdp"
enabled = false

[[pass]]
name = "pipeline_parallel"
enabled = false
EOF
fail() { echo "FAIL: $1"; [ -n "${2:-}" ] && cat "$2"; exit 1; }
"$strata" plan -n 2 "$work/qwen2.toml" > "$work/plan.log" 2>&1 || fail "plan" "$work/plan.log"
"$strata" run -n 2 "$work/qwen2.toml" --out "$work/run" > "$work/train.log" 2>&1 || fail "train at tensor 2" "$work/train.log"
# Resume with the saved strategy, resharded: one data-parallel fsdp over 3 ranks, tensor 1.
"$strata" run -n 3 "$work/run/strategy.toml" --out "$work/run" --resume --set job.steps=6 --set parallel.tensor=1 \
  --set pass.tensor_parallel.enabled=false --set pass.fsdp.enabled=true > "$work/resume.log" 2>&1 || fail "resume under fsdp 3" "$work/resume.log"
grep -q "resumed from .*step_00000004 at step 4 (saved by 2 ranks)" "$work/resume.log" || fail "not resumed at step 4" "$work/resume.log"
"$strata" ckpt export "$work/run" "$work/hf" > /dev/null || fail "export"
grep -q '"max_position_embeddings": 512,' "$work/hf/config.json" && grep -q '"model_type": "qwen2"' "$work/hf/config.json" ||
  fail "config.json does not state the model" "$work/hf/config.json"
"$python" - "$work/hf" "$work/greedy.bin" <<'PY' || fail "transformers"
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
rope = model.config.rope_parameters
assert type(model).__name__ == "Qwen2ForCausalLM", type(model).__name__
assert rope["rope_type"] == "llama3" and rope["factor"] == 8.0 and rope["original_max_position_embeddings"] == 32, rope
assert model.config.max_position_embeddings == 512
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
with torch.no_grad():
    out = model.generate(**tokenizer("In the", return_tensors="pt"), max_new_tokens=60, do_sample=False)
open(sys.argv[2], "wb").write(bytes(out[0].tolist()))
print(f"transformers: {type(model).__name__}, rope {rope['rope_type']}, context {model.config.max_position_embeddings}")
PY
"$strata" sample "$work/run" --prompt "In the" --tokens 60 --temperature 0 | head -c -1 > "$work/sample.bin"
cmp -s "$work/greedy.bin" "$work/sample.bin" || fail "strata sample's greedy text differs from transformers' generate"
"$strata" sample "$work/hf" --prompt "In the" --tokens 60 --temperature 0 | head -c -1 > "$work/sample_hf.bin"
cmp -s "$work/greedy.bin" "$work/sample_hf.bin" || fail "strata sample of the export differs from transformers' generate"
# The export starts a run at pipeline 2, [model] taken from its config.json: its first loss is the trained model's.
sed -e '/^\[model\]/,/^$/d' -e '/^\[parallel\]/,$d' -e 's/^steps = 4/steps = 1/' -e '/^model = "llama"$/d' "$work/qwen2.toml" > "$work/again.toml"
cat >> "$work/again.toml" <<EOF
[model]
init_from = "$work/hf"
seq_len = 48

[parallel]
pipeline = 2

[[pass]]
name = "pipeline_parallel"
EOF
"$strata" plan -n 2 "$work/again.toml" > "$work/again_plan.log" 2>&1 || fail "plan from init_from alone" "$work/again_plan.log"
for line in 'model += "llama"' "qkv_bias += true" 'rope_scaling += "llama3"' "rope_original_context += 32" "max_positions += 512" "ffn_hidden += 96"; do
  grep -Eq "^  $line +# $work/hf/config.json$" "$work/again_plan.log" || fail "plan did not take /$line/ from config.json" "$work/again_plan.log"
done
"$strata" run -n 2 "$work/again.toml" --out "$work/again" > "$work/again.log" 2>&1 || fail "init_from at pipeline 2" "$work/again.log"
first() { sed -n '1s/.*"loss":\([^,]*\),.*/\1/p' "$1"; }
fresh=$(first "$work/run/metrics.jsonl") loaded=$(first "$work/again/metrics.jsonl")
awk -v a="$loaded" -v b="$fresh" 'BEGIN { exit !(a < b - 0.3) }' || fail "first loss from the export $loaded, fresh $fresh"
# Its saved strategy states the chosen model and resumes on one rank.
grep -q '^model = "llama"$' "$work/again/strategy.toml" || fail "the saved strategy does not state the model" "$work/again/strategy.toml"
"$strata" run "$work/again/strategy.toml" --out "$work/again" --resume --set job.steps=2 --set parallel.pipeline=1 \
  --set pass.pipeline_parallel.enabled=false > "$work/again_resume.log" 2>&1 || fail "resume the init_from run on one rank" "$work/again_resume.log"
grep -q "resumed from .*step_00000001 at step 1" "$work/again_resume.log" || fail "not resumed at step 1" "$work/again_resume.log"
echo "OK: tensor 2 + sequence parallel -> fsdp 3 -> export (Qwen2ForCausalLM, llama3, context 512) -> greedy text as strata sample's -> [model] from its config.json at pipeline 2 (first loss $loaded, fresh $fresh)"
