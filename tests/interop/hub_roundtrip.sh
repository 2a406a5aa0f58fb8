#!/usr/bin/env bash
# hub_roundtrip.sh STRATA PYTHON WORKDIR
# Checkpoints as the Hugging Face hub ships them, through Strata and back.
# A Llama as the hub ships Llama 3.2: saved by transformers' save_pretrained in bf16,
# tied embeddings, rope_theta 500000 with Llama 3.1's rope scaling (rope_parameters, transformers 5),
# a SwiGLU width that is not Llama's rule. Strata's plan takes every [model] key the strategy leaves
# unset from config.json, naming it; so (one process), or with the keys stated (tensor parallel 2),
# it starts from the weights, trains two steps at a negligible learning rate and exports;
# transformers loads the export, and its logits are the hub model's (fp32) within 1e-5, and the
# scaling survives in config.json.
# GPT-2 as openai-community/gpt2 is stored: a GPT2Model (no "transformer." prefix on any name;
# 128 positions) trained at a shorter context (64) keeping all 128 (max_positions): the export's
# logits on 128 tokens are the hub model's as GPT2LMHeadModel loads it. Every export states the hub
# model's context (max_position_embeddings), which plan takes from config.json. Mixtral as
# transformers saves it (experts one tensor each), the same. Qwen2 (q/k/v biases, one kv head) at tensor 1 and 2, exported as Qwen2ForCausalLM.
set -euo pipefail
strata=$1 python=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
"$python" - "$work" <<'EOF'
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
work = sys.argv[1]
torch.manual_seed(0)
config = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, tie_word_embeddings=True, rms_norm_eps=1e-5, max_position_embeddings=256,
                     rope_parameters={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 64, "rope_theta": 500000.0})
LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(f"{work}/hub")
EOF
cat > "$work/run.toml" <<EOF
[job]
model = "llama"
dataset = "text"
steps = 2
global_batch = 4
eval_every = 0
checkpoint_every = 2
threads = 1

[model]
n_layer = 2
n_head = 4
n_kv_head = 2
d_model = 128
vocab_size = 256
seq_len = 64
init_from = "$work/hub"

[data]
path = "data/kjv.txt"

[optimizer]
lr = 1e-9

[[pass]]
name = "tensor_parallel"
enabled = false
EOF
# Plan takes what the strategy leaves unset from config.json, naming it.
"$strata" plan "$work/run.toml" > "$work/plan.log" 2>&1 || { echo "FAIL: plan"; cat "$work/plan.log"; exit 1; }
for key in "ffn_hidden += 384" "rope_theta += 5e\+05" 'rope_scaling += "llama3"' "rope_factor += 32.0" "rope_original_context += 64" \
           "tie_embeddings += true" "max_positions += 256"; do
  grep -Eq "^  $key +# $work/hub/config.json$" "$work/plan.log" || { echo "FAIL: plan does not take /$key/"; cat "$work/plan.log"; exit 1; }
done
stated=(--set model.ffn_hidden=384 --set model.rope_theta=500000.0 --set model.rope_scaling=llama3 --set model.rope_factor=32.0
        --set model.rope_original_context=64 --set model.tie_embeddings=true --set model.max_positions=256)
"$strata" run "$work/run.toml" --out "$work/one" > "$work/one.log" 2>&1 || { cat "$work/one.log"; exit 1; }
"$strata" run "$work/run.toml" -n 2 "${stated[@]}" --set parallel.tensor=2 --set pass.tensor_parallel.enabled=true --out "$work/tp" > "$work/tp.log" 2>&1 ||
  { cat "$work/tp.log"; exit 1; }
for run in one tp; do "$strata" ckpt export "$work/$run" "$work/$run.hf" > /dev/null; done
"$python" "$(dirname "$0")/hub_logits.py" 64 "$work/hub" "$work/one.hf" "$work/tp.hf" --class LlamaForCausalLM --rope-type llama3

# GPT-2's base-model checkpoint.
"$python" - "$work" <<'EOF'
import sys, torch
from transformers import GPT2Config, GPT2Model
torch.manual_seed(0)
GPT2Model(GPT2Config(vocab_size=256, n_positions=128, n_embd=64, n_layer=2, n_head=4)).save_pretrained(f"{sys.argv[1]}/gpt2_hub")
EOF
# Trained at 64 tokens, it keeps all 128 learned positions (max_positions, from config.json), as
# the logits on 128 tokens show.
"$strata" run examples/strategies/default.toml --set "model.init_from=$work/gpt2_hub" --set model.n_layer=2 --set model.d_model=64 \
  --set model.seq_len=64 --set job.steps=2 --set optimizer.lr=1e-9 --set job.eval_every=0 --set job.threads=1 --set job.global_batch=4 \
  --disable ddp --out "$work/gpt2" > "$work/gpt2.log" 2>&1 || { cat "$work/gpt2.log"; exit 1; }
"$strata" ckpt export "$work/gpt2" "$work/gpt2.hf" > /dev/null
"$python" "$(dirname "$0")/hub_logits.py" 128 "$work/gpt2_hub" "$work/gpt2.hf" --class GPT2LMHeadModel

# Mixtral as transformers saves it (experts one tensor each, MixtralConfig's rope_theta 1e6).
"$python" - "$work" <<'EOF'
import sys, torch
from transformers import MixtralConfig, MixtralForCausalLM
torch.manual_seed(0)
config = MixtralConfig(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)
MixtralForCausalLM(config).save_pretrained(f"{sys.argv[1]}/mixtral_hub")
EOF
"$strata" run tests/cli/mixtral.toml --set "model.init_from=$work/mixtral_hub" --set model.n_layer=2 \
  --set job.steps=2 --set optimizer.lr=1e-9 --set job.eval_every=0 --out "$work/mixtral" > "$work/mixtral.log" 2>&1 ||
  { cat "$work/mixtral.log"; exit 1; }
"$strata" ckpt export "$work/mixtral" "$work/mixtral.hf" > /dev/null
"$python" "$(dirname "$0")/hub_logits.py" 32 "$work/mixtral_hub" "$work/mixtral.hf" --class MixtralForCausalLM

# Qwen2 as transformers saves it: q/k/v biases (drawn, not zero), one kv head (whole on both
# tensor ranks), tied embeddings, rope_theta 1e6; plan names the lines, then tensor 1 and 2.
"$python" - "$work" <<'EOF'
import sys, torch
from transformers import Qwen2Config, Qwen2ForCausalLM
torch.manual_seed(0)
config = Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=1, tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
model = Qwen2ForCausalLM(config)
with torch.no_grad():
    for name, p in model.named_parameters():
        if name.endswith(".bias"):
            p.normal_()
model.save_pretrained(f"{sys.argv[1]}/qwen2_hub")
EOF
qwen2=(--set model.n_layer=2 --set model.n_head=4 --set model.n_kv_head=1 --set model.d_model=64 --set model.seq_len=32
       --set "model.init_from=$work/qwen2_hub" --set model.tie_embeddings=true --set model.ffn_hidden=96 --set model.norm_eps=1e-6)
# model_type qwen2 means the biases; config.json gives them, the rope base and the context.
"$strata" plan "$work/run.toml" "${qwen2[@]}" > "$work/qwen2_plan.log" 2>&1 || { echo "FAIL: qwen2 plan"; cat "$work/qwen2_plan.log"; exit 1; }
for key in "qkv_bias += true" "rope_theta += 1e\+06" "max_positions += 32768"; do
  grep -Eq "^  $key +# $work/qwen2_hub/config.json$" "$work/qwen2_plan.log" || { echo "FAIL: the qwen2 plan does not take /$key/"; cat "$work/qwen2_plan.log"; exit 1; }
done
"$strata" run "$work/run.toml" "${qwen2[@]}" --out "$work/qwen2_one" > "$work/qwen2_one.log" 2>&1 || { cat "$work/qwen2_one.log"; exit 1; }
qwen2+=(--set model.qkv_bias=true --set model.rope_theta=1000000.0 --set model.max_positions=32768)
"$strata" run "$work/run.toml" -n 2 "${qwen2[@]}" --set parallel.tensor=2 --set pass.tensor_parallel.enabled=true --out "$work/qwen2_tp" \
  > "$work/qwen2_tp.log" 2>&1 || { cat "$work/qwen2_tp.log"; exit 1; }
for run in qwen2_one qwen2_tp; do "$strata" ckpt export "$work/$run" "$work/$run.hf" > /dev/null; done
"$python" "$(dirname "$0")/hub_logits.py" 32 "$work/qwen2_hub" "$work/qwen2_one.hf" "$work/qwen2_tp.hf" --class Qwen2ForCausalLM
