#!/usr/bin/env bash
# init_from_config_test.sh STRATA WORKDIR
# [model] init_from and the checkpoint's config.json (plugins/models/hf_config_check.h), at plan
# time. The config.json files are written here as transformers 5.23 writes them (rope_parameters)
# and as transformers 4 did (rope_theta, rope_scaling at the top). A [model] key the strategy
# leaves unset takes config.json's value, shown in the plan with the file it came from (a
# [model] with init_from alone describes the model; Llama 3.1's rope scaling, a longer context,
# Qwen2's biases included); a stated key that differs is refused naming both values and the value
# to write; a feature the model does not compute (another rope scaling, another activation,
# biases) is refused; a config.json of another model type is refused; [job] model and dataset
# left out are chosen by config.json's model_type and a prepared data directory; `strata run` refuses
# before training, with nothing written; a checkpoint without config.json plans as before (names
# and shapes only).
set -euo pipefail
strata=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
llama=examples/strategies/llama_text.toml gpt=examples/strategies/default.toml mixtral=tests/cli/mixtral.toml

# plan_case NAME STATUS REGEX STRATEGY [ARGS...]: `strata plan` exits STATUS and its output matches REGEX.
plan_case() {
  local name=$1 want=$2 regex=$3 strategy=$4
  shift 4
  set +e
  "$strata" plan "$strategy" "$@" > "$work/$name.log" 2>&1
  local status=$?
  set -e
  [ "$status" = "$want" ] || { echo "FAIL $name: exit $status, expected $want"; cat "$work/$name.log"; exit 1; }
  grep -Eq -- "$regex" "$work/$name.log" || { echo "FAIL $name: no line matches /$regex/"; cat "$work/$name.log"; exit 1; }
  echo "ok $name"
}
# llama_config DIR [ROPE_PARAMETERS] [EXTRA] [CONTEXT]: llama_text.toml's model as transformers 5 saves it.
llama_config() {
  mkdir -p "$1"
  cat > "$1/config.json" <<EOF
{
  "attention_bias": false, "head_dim": 32, "hidden_act": "silu", "hidden_size": 128, "intermediate_size": 512,
  "max_position_embeddings": ${4:-128}, "mlp_bias": false, "model_type": "llama", "num_attention_heads": 4,
  "num_hidden_layers": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-05,
  "rope_parameters": ${2:-{\"rope_theta\": 10000.0, \"rope_type\": \"default\"\}},
  ${3:-}"tie_word_embeddings": true, "transformers_version": "5.23.0", "vocab_size": 256
}
EOF
}

llama_config "$work/llama"
plan_case llama_matches 0 "^  init_from += \"$work/llama\"" "$llama" --set "model.init_from=$work/llama"
# A file named in the directory finds config.json beside it (the file itself is read by the run).
plan_case llama_file_beside 0 "init_from" "$llama" --set "model.init_from=$work/llama/model.safetensors"
plan_case llama_heads 2 "--set model.n_head=8: error: \[model\] n_head = 8, but the weights' $work/llama/config.json has num_attention_heads = 4; set \[model\] n_head = 4 to load them$" \
  "$llama" --set "model.init_from=$work/llama" --set model.n_head=8 --set model.n_kv_head=4
grep -Eq "the head size, d_model / n_head, is 16, but the weights' .* has head_dim = 32" "$work/llama_heads.log" || { echo "FAIL: no head_dim line"; exit 1; }
llama_config "$work/llama_theta" '{"rope_theta": 500000.0, "rope_type": "default"}'
plan_case llama_rope_theta_default 0 "^  rope_theta += 5e\+05 +# $work/llama_theta/config.json$" "$llama" --set "model.init_from=$work/llama_theta"
plan_case llama_rope_theta_stated 2 "--set model.rope_theta=10000.0: error: \[model\] rope_theta = 10000.0, but the weights' .* has rope_theta = 500000.0; set \[model\] rope_theta = 500000.0 to load them$" \
  "$llama" --set "model.init_from=$work/llama_theta" --set model.rope_theta=10000.0
llama_config "$work/llama3" '{"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "rope_theta": 10000.0, "rope_type": "llama3"}'
# Llama 3.1's rope scaling: taken with its parameters (the scaling first, then its keys); stated, the same ones.
plan_case llama3_rope_scaling 0 "^  rope_scaling += \"llama3\" +# $work/llama3/config.json$" "$llama" --set "model.init_from=$work/llama3"
grep -Eq "^  rope_factor += 32.0 +# $work/llama3/config.json$" "$work/llama3_rope_scaling.log" || { echo "FAIL: rope_factor not taken"; exit 1; }
plan_case llama3_rope_matches 0 "^  rope_scaling += \"llama3\" +# --set" "$llama" --set "model.init_from=$work/llama3" --set model.rope_scaling=llama3 --set model.rope_factor=32.0
plan_case llama3_rope_factor 2 "--set model.rope_factor=8.0: error: \[model\] rope_factor = 8.0, but the weights' .* has factor = 32.0; set \[model\] rope_factor = 32.0 to load them$" \
  "$llama" --set "model.init_from=$work/llama3" --set model.rope_scaling=llama3 --set model.rope_factor=8.0
plan_case llama3_rope_stated_none 2 "--set model.rope_scaling=none: error: \[model\] rope_scaling = \"none\", but the weights' .*/llama3/config.json has rope type = \"llama3\"; set \[model\] rope_scaling = \"llama3\" to load them$" \
  "$llama" --set "model.init_from=$work/llama3" --set model.rope_scaling=none
llama_config "$work/yarn" '{"factor": 4.0, "original_max_position_embeddings": 2048, "rope_theta": 10000.0, "rope_type": "yarn"}'
plan_case yarn_rope_scaling 2 "has rope type yarn \(rotary embeddings scaled another way than llama3\), which this model does not compute$" \
  "$llama" --set "model.init_from=$work/yarn"
# transformers 4's form: rope_theta and rope_scaling at the top.
mkdir -p "$work/llama_v4"
sed -e 's/"rope_parameters": {[^}]*},/"rope_theta": 10000.0, "rope_scaling": {"type": "linear", "factor": 2.0},/' "$work/llama/config.json" > "$work/llama_v4/config.json"
plan_case llama_v4_rope_scaling 2 "has rope type linear \(rotary embeddings scaled another way than llama3\)" \
  "$llama" --set "model.init_from=$work/llama_v4"
llama_config "$work/llama_bias" "" '"mlp_bias": true, "hidden_act": "gelu", '
plan_case llama_features 2 "has hidden_act = \"gelu\" \(an MLP activation other than SiLU\)" "$llama" --set "model.init_from=$work/llama_bias"
grep -q 'has mlp_bias = true (biases in the MLP)' "$work/llama_features.log" || { echo "FAIL: no mlp_bias line"; exit 1; }
# A value of another type (a hand-edited config.json) names config.json as what to correct.
mkdir -p "$work/llama_string" && sed 's/"num_hidden_layers": 4/"num_hidden_layers": "4"/' "$work/llama/config.json" > "$work/llama_string/config.json"
plan_case llama_string_value 2 "error: \[model\] n_layer = 4, but the weights' .*/llama_string/config.json has num_hidden_layers = \"4\"; that is not an integer, as \[model\] n_layer is: correct config.json$" \
  "$llama" --set "model.init_from=$work/llama_string"
plan_case llama_untied 2 "error: \[model\] tie_embeddings = false, but the weights' .* has tie_word_embeddings = true; set \[model\] tie_embeddings = true to load them$" \
  "$llama" --set "model.init_from=$work/llama" --set model.tie_embeddings=false
# The context config.json states (Llama 3.2's 131072): taken, or a stated one kept; one shorter than
# seq_len is not taken (the line to write is named); max_positions below seq_len is refused.
llama_config "$work/llama_long" "" "" 131072
plan_case llama_context 0 "^  max_positions += 131072 +# $work/llama_long/config.json$" "$llama" --set "model.init_from=$work/llama_long"
plan_case llama_context_stated 0 "^  max_positions += 128 +# --set" "$llama" --set "model.init_from=$work/llama_long" --set model.max_positions=128
llama_config "$work/llama_short" "" "" 64
plan_case llama_context_shorter 2 "error: \[model\] max_positions = 0 \(the default: seq_len, 128\), but the weights' .*/llama_short/config.json has max_position_embeddings = 64; set \[model\] max_positions = 64 to load them \(or = 128 for an export that states this run's context\)$" \
  "$llama" --set "model.init_from=$work/llama_short"
plan_case max_positions_below_seq_len 2 "--set model.max_positions=64: error: \[model\] max_positions = 64 is less than seq_len = 128, the context it trains on; set it >= 128 \(or 0: seq_len\)$" \
  "$llama" --set model.max_positions=64
# qwen2 is the llama model with q/k/v biases: taken, or refused where the strategy states none.
mkdir -p "$work/qwen" && sed 's/"model_type": "llama"/"model_type": "qwen2"/' "$work/llama/config.json" > "$work/qwen/config.json"
plan_case qwen2_biases 0 "^  qkv_bias += true +# $work/qwen/config.json$" "$llama" --set "model.init_from=$work/qwen"
plan_case qwen2_stated_without_biases 2 "init_from: .*/qwen/config.json describes a qwen2 model, but this \[model\] loads llama \(LlamaForCausalLM\) or mistral \(\[model\] qkv_bias = true loads qwen2\) weights$" \
  "$llama" --set "model.init_from=$work/qwen" --set model.qkv_bias=false
mkdir -p "$work/gpt_type" && sed 's/"model_type": "llama"/"model_type": "gpt2"/' "$work/llama/config.json" > "$work/gpt_type/config.json"
plan_case llama_other_type 2 "init_from: .*/gpt_type/config.json describes a gpt2 model, but this \[model\] loads llama .* weights; \[job\] model = \"gpt\" loads it$" "$llama" --set "model.init_from=$work/gpt_type"

# [model] init_from alone: every size from config.json (here a bigger model than llama_text's
# defaults would be, and a vocabulary above the data's, which is allowed).
mkdir -p "$work/bare_llama"
sed -e 's/"hidden_size": 128/"hidden_size": 96/; s/"head_dim": 32/"head_dim": 24/; s/"intermediate_size": 512/"intermediate_size": 200/; s/"num_hidden_layers": 4/"num_hidden_layers": 3/; s/"vocab_size": 256/"vocab_size": 300/; s/"rms_norm_eps": 1e-05/"rms_norm_eps": 1e-06/' \
  "$work/llama/config.json" > "$work/bare_llama/config.json"
sed -e '/^\[model\]/,/^$/d' "$llama" > "$work/bare.toml"
printf '[model]\ninit_from = "%s"\nseq_len = 64\n' "$work/bare_llama" >> "$work/bare.toml"
plan_case init_from_alone 0 "^  n_layer += 3 +# $work/bare_llama/config.json$" "$work/bare.toml"
for line in "n_head += 4" "n_kv_head += 2" "d_model += 96" "ffn_hidden += 200" "vocab_size += 300" "norm_eps += 1e-06" "tie_embeddings += true"; do
  grep -Eq "^  $line +# $work/bare_llama/config.json$" "$work/init_from_alone.log" || { echo "FAIL init_from_alone: no /$line/"; cat "$work/init_from_alone.log"; exit 1; }
done
# Prepared data's vocabulary (meta.json) yields to the weights' (a larger model vocabulary is allowed);
# without init_from it is taken.
mkdir -p "$work/prepared"
echo '{"format": "strata-tokens 1", "vocab_size": 256, "eos_id": 0, "dtype": "uint16", "eos_token": "<|endoftext|>"}' > "$work/prepared/meta.json"
plan_case weights_vocab_over_data 0 "^  vocab_size += 300 +# $work/bare_llama/config.json$" "$work/bare.toml" --set "data.path=$work/prepared"
plan_case data_vocab_without_weights 0 "^  vocab_size += 256 +# $work/prepared/meta.json$" "$work/bare.toml" --set "data.path=$work/prepared" \
  --set model.init_from= --set model.n_head=4 --set model.n_kv_head=4 --set model.d_model=64

# GPT-2 (default.toml's model), as GPT2Config saves it.
mkdir -p "$work/gpt2"
cat > "$work/gpt2/config.json" <<'EOF'
{"activation_function": "gelu_new", "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_embd": 128, "n_head": 4,
 "n_inner": null, "n_layer": 4, "n_positions": 128, "reorder_and_upcast_attn": false, "scale_attn_by_inverse_layer_idx": false,
 "scale_attn_weights": true, "tie_word_embeddings": true, "vocab_size": 256}
EOF
plan_case gpt_matches 0 "init_from" "$gpt" --set "model.init_from=$work/gpt2"
# A shorter context keeps the learned positions it states (all, or the first seq_len); a longer
# one, or a larger table, has none to take.
plan_case gpt_shorter_context 0 "^  max_positions += 128 +# $work/gpt2/config.json$" "$gpt" --set "model.init_from=$work/gpt2" --set model.seq_len=64
plan_case gpt_shorter_context_kept 0 "^  max_positions += 128" "$gpt" --set "model.init_from=$work/gpt2" --set model.seq_len=64 --set model.max_positions=128
plan_case gpt_shorter_context_cropped 0 "^  max_positions += 64" "$gpt" --set "model.init_from=$work/gpt2" --set model.seq_len=64 --set model.max_positions=64
plan_case gpt_longer_context 2 "error: \[model\] seq_len = 256, but the weights' .*/gpt2/config.json has n_positions = 128: their learned position table has no rows beyond; set \[model\] seq_len <= 128$" \
  "$gpt" --set "model.init_from=$work/gpt2" --set model.seq_len=256
plan_case gpt_larger_table 2 "error: \[model\] max_positions = 256, but the weights' .* has n_positions = 128: their learned position table has no rows beyond; set \[model\] max_positions <= 128$" \
  "$gpt" --set "model.init_from=$work/gpt2" --set model.max_positions=256
mkdir -p "$work/gpt2_other" && sed -e 's/"gelu_new"/"gelu"/; s/"n_inner": null/"n_inner": 300/' "$work/gpt2/config.json" > "$work/gpt2_other/config.json"
plan_case gpt_features 2 "has activation_function = \"gelu\" \(a GELU other than the tanh approximation\)" "$gpt" --set "model.init_from=$work/gpt2_other"
grep -q "the MLP width, 4 x d_model, is 512, but the weights' .* has n_inner = 300" "$work/gpt_features.log" || { echo "FAIL: no n_inner line"; exit 1; }

# Mixtral (tests/cli/mixtral.toml's model), as MixtralConfig saves it.
mkdir -p "$work/mixtral"
cat > "$work/mixtral/config.json" <<'EOF'
{"head_dim": null, "hidden_act": "silu", "hidden_size": 64, "intermediate_size": 96, "model_type": "mixtral",
 "num_attention_heads": 4, "num_experts_per_tok": 2, "num_hidden_layers": 3, "num_key_value_heads": 2, "num_local_experts": 4,
 "rms_norm_eps": 1e-05, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "sliding_window": null,
 "tie_word_embeddings": false, "vocab_size": 256}
EOF
plan_case mixtral_matches 0 "init_from" "$mixtral" --set "model.init_from=$work/mixtral"
mkdir -p "$work/mixtral_8" && sed -e 's/"num_local_experts": 4/"num_local_experts": 8/; s/"sliding_window": null/"sliding_window": 16/' \
  "$work/mixtral/config.json" > "$work/mixtral_8/config.json"
plan_case mixtral_experts 2 "error: \[model\] n_experts = 4, but the weights' .* has num_local_experts = 8; set \[model\] n_experts = 8 to load them$" \
  "$mixtral" --set "model.init_from=$work/mixtral_8"
grep -q "sliding_window" "$work/mixtral_experts.log" && { echo "FAIL: sliding_window (left unset) not taken"; cat "$work/mixtral_experts.log"; exit 1; }
plan_case mixtral_window 0 "^  sliding_window += 16 +# $work/mixtral_8/config.json$" "$mixtral" --set "model.init_from=$work/mixtral_8" --set model.n_experts=8

# [job] model left out as well: the registered model that loads config.json's model_type, shown
# with the file (LoadsHfModelTypes); [job] dataset left out with a prepared [data] path: tokens.
# A model_type no bundled model loads leaves the key missing, reported with when it may be left out.
sed -e '/^model = "llama"$/d' "$work/bare.toml" > "$work/no_model.toml"
plan_case model_from_config_llama 0 "^  model += \"llama\" +# $work/bare_llama/config.json$" "$work/no_model.toml"
plan_case model_from_config_qwen2 0 "^  model += \"llama\" +# $work/qwen/config.json$" "$work/no_model.toml" --set "model.init_from=$work/qwen"
grep -Eq "^  qkv_bias += true +# $work/qwen/config.json$" "$work/model_from_config_qwen2.log" || { echo "FAIL: qwen2 biases not taken"; exit 1; }
plan_case model_from_config_gpt 0 "^  model += \"gpt\" +# $work/gpt2/config.json$" "$work/no_model.toml" --set "model.init_from=$work/gpt2"
plan_case model_from_config_mixtral 0 "^  model += \"mixtral\" +# $work/mixtral/config.json$" "$work/no_model.toml" --set "model.init_from=$work/mixtral"
mkdir -p "$work/bert" && echo '{"model_type": "bert", "hidden_size": 64}' > "$work/bert/config.json"
plan_case model_from_config_unknown 2 "error: \[job\] needs key 'model' \(.*may be left out when \[model\] init_from has a config.json" \
  "$work/no_model.toml" --set "model.init_from=$work/bert"
[ "$(grep -c error "$work/model_from_config_unknown.log")" = 1 ] || { echo "FAIL: more than one error"; cat "$work/model_from_config_unknown.log"; exit 1; }
plan_case model_stated_kept 2 "describes a gpt2 model, but this \[model\] loads llama" "$work/no_model.toml" --set "model.init_from=$work/gpt2" --set job.model=llama
sed -e '/^dataset = "text"$/d' "$work/no_model.toml" > "$work/no_components.toml"
plan_case dataset_from_prepared 0 "^  dataset += \"tokens\" +# $work/prepared/meta.json$" "$work/no_components.toml" --set "data.path=$work/prepared"
# Other [data] paths say what they hold too: text files (the bundled kjv.txt, a directory of .txt
# files) are the text dataset; a .bin file or nanoGPT's train.bin/val.bin directory, tokens. A path
# that says neither (a .csv) leaves the key missing, reported once.
plan_case dataset_from_text_file 0 "^  dataset += \"text\" +# data/kjv.txt$" "$work/no_components.toml" --set data.path=data/kjv.txt
mkdir -p "$work/texts" "$work/bins" && head -c 4000 data/kjv.txt > "$work/texts/a.txt"
head -c 4000 /dev/zero > "$work/bins/train.bin" && head -c 4000 /dev/zero > "$work/bins/val.bin"
plan_case dataset_from_text_directory 0 "^  dataset += \"text\" +# $work/texts$" "$work/no_components.toml" --set "data.path=$work/texts"
plan_case dataset_from_bin_directory 0 "^  dataset += \"tokens\" +# $work/bins/train.bin$" "$work/no_components.toml" --set "data.path=$work/bins"
plan_case dataset_from_bin_file 0 "^  dataset += \"tokens\" +# $work/bins/val.bin$" "$work/no_components.toml" --set "data.path=$work/bins/val.bin"
head -c 100 data/kjv.txt > "$work/table.csv"
plan_case dataset_unknown 2 "error: \[job\] needs key 'dataset' \(.*may be left out when \[data\] path says" "$work/no_components.toml" --set "data.path=$work/table.csv"
[ "$(grep -c error "$work/dataset_unknown.log")" = 1 ] || { echo "FAIL: more than one error"; cat "$work/dataset_unknown.log"; exit 1; }

# Weights with a tokenizer other than a byte-level run's, fine-tuned on the text dataset (token id
# = byte): refused, naming the tokenizer and the `strata data prepare` that tokenizes the text.
mkdir -p "$work/llama_bpe" && cp "$work/llama/config.json" "$work/llama_bpe/"
echo '{"model": {"type": "BPE", "vocab": {"!": 0, "\"": 1, "#": 2}, "merges": []}, "added_tokens": []}' > "$work/llama_bpe/tokenizer.json"
plan_case text_data_other_tokenizer 2 "error: \[data\] path: the text dataset's token ids are bytes, but the weights' $work/llama_bpe/tokenizer.json is another tokenizer \(id 0 is \"!\" for the weights, byte \"Ā\" in the data\): tokenize the text with it, \`strata data prepare data/kjv.txt -o DIR --tokenizer $work/llama_bpe/tokenizer.json\`, and train on DIR$" \
  "$llama" --set "model.init_from=$work/llama_bpe"

# `strata run` refuses the same way before a rank trains, and writes nothing.
set +e
"$strata" run "$llama" --set "model.init_from=$work/llama" --set model.n_head=8 --set model.n_kv_head=4 --out "$work/run" > "$work/run.log" 2>&1
status=$?
set -e
[ "$status" = 2 ] && grep -q "n_head = 8, but the weights'" "$work/run.log" && [ ! -e "$work/run/metrics.jsonl" ] ||
  { echo "FAIL run: exit $status"; cat "$work/run.log"; exit 1; }
echo "ok run_refuses"

# No config.json: names and shapes only, as before.
mkdir -p "$work/bare"
plan_case no_config_json 0 "init_from" "$llama" --set "model.init_from=$work/bare" --set model.n_head=8 --set model.n_kv_head=4

# The llama3 scaling's keys without it are refused, as is a band that is not one.
plan_case rope_keys_without_scaling 2 "error: \[model\] rope_factor applies to rope_scaling = \"llama3\" only, and rope_scaling is \"none\"$" \
  "$llama" --set model.rope_factor=16.0
plan_case rope_band 2 "error: \[model\] rope_high_freq_factor \(1.0\) must be greater than rope_low_freq_factor \(1.0\)$" \
  "$llama" --set model.rope_scaling=llama3 --set model.rope_high_freq_factor=1.0

# A directory of PyTorch pickles only (older hub repositories): named, with the way to convert it.
mkdir -p "$work/pickles" && touch "$work/pickles/pytorch_model.bin"
set +e
"$strata" run "$gpt" --set "model.init_from=$work/pickles" --out "$work/pickles_run" > "$work/pickles.log" 2>&1
status=$?
set -e
[ "$status" = 2 ] && grep -q "^strata: error: $work/pickles holds neither model.safetensors nor model.safetensors.index.json; its pytorch_model.bin is a pickle, which Strata does not read" "$work/pickles.log" ||
  { echo "FAIL pickles: exit $status"; cat "$work/pickles.log"; exit 1; }
echo "ok pickles_named"
