// Llama: RMSNorm, rotary position embedding (rotate-half layout), SwiGLU MLP, grouped-query
// attention, no biases. Mixtral: Llama whose MLPs (all, or every moe_every-th) are mixtures of
// experts (moe_layer.h).
#include "hf_config_check.h"
#include "llama_layers.h"
#include "rope_frequencies.h"
#include "moe_layer.h"

namespace strata::models {
namespace {

using llama::Attention, llama::Embed, llama::Head, llama::Mlp, llama::llama_hidden;

// Qwen2's q, k and v biases ([model] qkv_bias, a dense model's key).
bool qkv_bias(const Config& c) { return c.has("qkv_bias") && c.get_bool("qkv_bias"); }

class DecoderLayer final : public nn::Block {
 public:
  // moe: the MLP is a mixture of experts (transformers' "block_sparse_moe"), else dense SwiGLU.
  DecoderLayer(const Config& c, int64_t hidden, nn::TensorShard shard, bool moe) : Block("block") {
    const int64_t d = c.get_int("d_model");
    const double eps = c.get_float("norm_eps");
    input_layernorm = register_module("input_layernorm", std::make_shared<nn::RmsNorm>(d, eps, nn::ParallelStyle::Sequence));
    self_attn = register_module("self_attn", std::make_shared<Attention>(d, c.get_int("n_head"), c.get_int("n_kv_head"),
                                                                         RopeFrequencies::from(c), qkv_bias(c), shard));
    post_attention_layernorm =
        register_module("post_attention_layernorm", std::make_shared<nn::RmsNorm>(d, eps, nn::ParallelStyle::Sequence));
    if (moe)
      block_sparse_moe = register_module("block_sparse_moe", std::make_shared<MoeLayer>(MoeSettings::from(c), d, hidden, shard));
    else
      mlp = register_module("mlp", std::make_shared<Mlp>(d, hidden, shard));
  }
  at::Tensor forward(const at::Tensor& x) override {
    // h = x + attention and its norm in one operator (add_rms_norm), which a kernel may fuse.
    const ops::AddNormResult h = post_attention_layernorm->forward_residual(x, self_attn->forward(input_layernorm->forward(x)));
    return h.sum + (mlp ? mlp->forward(h.normed) : block_sparse_moe->forward(h.normed));
  }
  std::shared_ptr<nn::RmsNorm> input_layernorm, post_attention_layernorm;
  std::shared_ptr<Attention> self_attn;
  std::shared_ptr<Mlp> mlp;
  std::shared_ptr<MoeLayer> block_sparse_moe;
};

// Llama's keys; Mixtral adds the mixture of experts' (moe_layer.h).
Schema llama_schema(bool moe) {
  Schema schema;
  add_rope_keys(add_max_positions(add_sliding_window(schema)))
      .integer("n_layer", 16, "Transformer blocks", between(1, 1 << 14))
      .integer("n_head", 16, "Query heads", between(1, 1 << 14))
      .integer("n_kv_head", 16, "Key/value heads (grouped-query attention)", between(1, 1 << 14))
      .integer("d_model", 2048, "Hidden size", between(1, 1 << 18))
      .integer("ffn_hidden", 0, moe ? "SwiGLU hidden size of each expert (and of dense blocks); 0 = Llama's rule (2/3 of 4 d_model, multiple of 256)"
                                    : "SwiGLU hidden size; 0 = Llama's rule (2/3 of 4 d_model, multiple of 256)",
               between(0, 1 << 20))
      .integer("vocab_size", 32000, "Vocabulary size", between(1, 1 << 24))
      .integer("seq_len", 2048, "Context length", between(1, 1 << 24))
      .real("norm_eps", 1e-5, "RMSNorm epsilon", between(0, 1))
      .boolean("tie_embeddings", false, "Share the input embedding with the output head");
  if (moe)
    return add_moe_keys(schema).string("init_from", "",
                                       "Hugging Face MixtralForCausalLM weights (model.safetensors, its directory, or a sharded index; relative: to the working directory); the [model] keys left unset take the values of the config.json beside them, the ones set are checked against it; empty = random init");
  return schema.boolean("qkv_bias", false, "Biases on the q, k and v projections (Qwen2: its checkpoints load and export as Qwen2ForCausalLM)")
      .string("init_from", "", "Hugging Face LlamaForCausalLM (or, with qkv_bias, Qwen2ForCausalLM) weights (model.safetensors, its directory, or a sharded index; relative: to the working directory); the [model] keys left unset take the values of the config.json beside them, the ones set are checked against it; empty = random init");
}

class Llama final : public ModelFactory, public DerivesDefaults, public LoadsHfModelTypes {
 public:
  explicit Llama(bool moe)
      : ModelFactory({ComponentKind::Model, moe ? "mixtral" : "llama",
                      moe ? "Mixtral architecture: Llama with mixture-of-experts MLPs (top-k routing, grouped experts, balance losses)"
                          : "Llama architecture: RMSNorm, RoPE, SwiGLU, grouped-query attention",
                      llama_schema(moe)}),
        moe_(moe) {}

  void validate(const Config& config, const SourcePos& section, Diagnostics& diagnostics) const override {
    check_heads(config, section, diagnostics);
    if (config.get_int("n_head") % config.get_int("n_kv_head") != 0)
      diagnostics.error(section, "[model] n_head (" + std::to_string(config.get_int("n_head")) +
                                     ") must be a multiple of n_kv_head (" + std::to_string(config.get_int("n_kv_head")) + ")");
    if ((config.get_int("d_model") / config.get_int("n_head")) % 2 != 0)
      diagnostics.error(section, "[model] d_model / n_head must be even for rotary embeddings");
    if (moe_) validate_moe(config, section, diagnostics);
    validate_rope(config, section, diagnostics);
    check_max_positions(config, diagnostics);
    HfConfigCheck hf(config, section, diagnostics);
    if (hf) check_hf_config(config, hf);
  }

  // The [model] keys a strategy leaves unset take the values of the weights' config.json.
  std::vector<Derived> derived_defaults(const Config& config) const override {
    return HfConfigCheck::derived(config, [&](HfConfigCheck& hf) { check_hf_config(config, hf); });
  }
  // qwen2 sets qkv_bias (derived_defaults); mistral's sliding window is a [model] key.
  std::vector<std::string> hf_model_types() const override { return hf_model_types_of(name()); }

  std::shared_ptr<nn::Model> create(const Config& c) const override { return create_shard(c, {}); }

  // Whole q heads and SwiGLU columns per rank; kv heads split when they divide and stay whole
  // (Replicated) otherwise; the vocabulary splits unevenly when it must (nn::shard_range).
  std::string split_problem(const Config& c, int64_t parts) const override {
    const int64_t hidden = c.get_int("ffn_hidden") > 0 ? c.get_int("ffn_hidden") : llama_hidden(c.get_int("d_model"));
    const std::string by = " does not divide by [parallel] tensor = " + std::to_string(parts);
    if (c.get_int("n_head") % parts != 0) return "[model] n_head " + std::to_string(c.get_int("n_head")) + by;
    if (hidden % parts != 0) return "[model] ffn_hidden (the SwiGLU width, " + std::to_string(hidden) + ")" + by;
    if (c.get_int("vocab_size") < parts)
      return "[model] vocab_size " + std::to_string(c.get_int("vocab_size")) + " is smaller than [parallel] tensor = " + std::to_string(parts);
    return {};
  }

  std::string describe_split(const Config& c, int64_t parts) const override {
    const int64_t heads = c.get_int("n_head"), kv = c.get_int("n_kv_head");
    const int64_t hidden = c.get_int("ffn_hidden") > 0 ? c.get_int("ffn_hidden") : llama_hidden(c.get_int("d_model"));
    std::string out = "attention: " + std::to_string(heads / parts) + " of " + std::to_string(heads) + " q heads per rank; ";
    out += kv % parts == 0 ? std::to_string(kv / parts) + " of " + std::to_string(kv) + " kv heads per rank (k_proj, v_proj split)\n"
                           : "kv heads replicated: n_kv_head " + std::to_string(kv) + " does not divide by " + std::to_string(parts) +
                                 ", so every rank holds all " + std::to_string(kv) + " (k_proj, v_proj whole, gradients summed)\n";
    out += "mlp: " + std::to_string(hidden / parts) + " of " + std::to_string(hidden) + " SwiGLU columns per rank\n";
    if (moe_)
      out += "experts: " + std::to_string(hidden / parts) + " of " + std::to_string(hidden) + " SwiGLU columns of each of the " +
             std::to_string(c.get_int("n_experts")) + " experts per rank; the router whole (every rank routes alike, on the gathered sequence under sequence parallel)\n";
    return out + vocab_line(c.get_int("vocab_size"), parts) + (c.get_bool("tie_embeddings") ? " (token embedding and tied head)\n"
                                                                                             : " (token embedding and lm_head)\n");
  }

  ModelShape shape(const Config& c) const override {
    ModelShape s;
    s.layers = c.get_int("n_layer"), s.hidden = c.get_int("d_model"), s.heads = c.get_int("n_head"), s.kv_heads = c.get_int("n_kv_head");
    s.ffn_hidden = c.get_int("ffn_hidden") > 0 ? c.get_int("ffn_hidden") : llama_hidden(s.hidden);
    s.seq_len = c.get_int("seq_len"), s.vocab = c.get_int("vocab_size");
    const int64_t d = s.hidden, kv_width = s.kv_heads * (d / s.heads);
    // Two RMSNorms, q and o (d x d), k and v (d x kv_width), SwiGLU's three matrices.
    s.layer_parameters = 2 * d + 2 * d * d + 2 * d * kv_width + 3 * d * s.ffn_hidden + (qkv_bias(c) ? d + 2 * kv_width : 0);
    if (moe_) {  // an MoE block holds the router, the experts and shared experts instead of one MLP: the mean block
      const int64_t experts = c.get_int("n_experts"), moe_blocks = moe_layer_count(c);
      const int64_t moe_extra = d * experts + 3 * d * s.ffn_hidden * (experts + c.get_int("shared_experts") - 1);
      s.layer_parameters += moe_extra * moe_blocks / s.layers;
    }
    s.parameters = s.layers * s.layer_parameters + s.vocab * d * (c.get_bool("tie_embeddings") ? 1 : 2) + d;
    s.blocks = s.layers + 2;  // embed, h0.., head
    return s;
  }

  // Attention (by heads) and MLP split over the tensor ranks, the token embedding and the head by
  // vocabulary rows; norms stay whole.
  std::shared_ptr<nn::Model> create_shard(const Config& c, nn::TensorShard shard) const override {
    const int64_t n_layer = c.get_int("n_layer"), d = c.get_int("d_model"), vocab = c.get_int("vocab_size");
    const int64_t hidden = c.get_int("ffn_hidden") > 0 ? c.get_int("ffn_hidden") : llama_hidden(d);
    if (const std::string problem = split_problem(c, shard.parts); !problem.empty()) throw UserError(problem);
    if (moe_ && !c.get_string("init_from").empty()) require_hub_mixtral(c);
    InitFrom loading(c, hf_layout(c));
    auto model = std::make_shared<nn::Model>(vocab, c.get_int("seq_len"));
    auto embed = std::make_shared<Embed>(vocab, d, shard);
    model->add_block("embed", embed);
    for (int64_t i = 0; i < n_layer; ++i)
      model->add_block("layers" + std::to_string(i), std::make_shared<DecoderLayer>(c, hidden, shard, moe_ && is_moe_layer(c, i)));
    model->add_block("head", std::make_shared<Head>(d, vocab, c.get_float("norm_eps"),
                                                    c.get_bool("tie_embeddings") ? embed->embed_tokens : nullptr, shard));
    if (c.get_bool("tie_embeddings")) model->mark_shared("embed.embed_tokens.weight");
    model->set_attention_shape(n_layer, c.get_int("n_head"), d / c.get_int("n_head"));
    apply_sliding_window(*model, c);
    if (moe_) {  // a token runs top_k of the routed experts: 3 d hidden parameters each
      const double unchosen = static_cast<double>(c.get_int("n_experts") - c.get_int("top_k"));
      model->set_inactive_parameters(static_cast<double>(moe_layer_count(c)) * unchosen * 3.0 * static_cast<double>(d * hidden));
    }
    loading.finish(*model);
    return model;
  }

  NamedTensors to_hf(const nn::Model& model, const Config& c) const override {
    require_hub_layout(c);
    const NamedTensors out = map_to_hf(model, hf_name);
    return moe_ ? hub_experts_from_stacked(out) : out;
  }

  NamedTensors from_hf(const NamedTensors& hf, const Config& c) const override {
    if (moe_) require_hub_mixtral(c);
    return map_from_hf(hf, *whole_model(*this, c), hf_layout(c));
  }

  std::string hf_config_json(const Config& c) const override {
    require_hub_layout(c);
    const int64_t d = c.get_int("d_model");
    const int64_t hidden = c.get_int("ffn_hidden") > 0 ? c.get_int("ffn_hidden") : llama_hidden(d);
    const int64_t window = c.get_int("sliding_window");
    const std::string window_json = "  \"sliding_window\": " + (window > 0 ? std::to_string(window) : std::string("null")) + ",\n";
    const std::string experts =  // MixtralForCausalLM's routing
        moe_ ? "  \"num_local_experts\": " + std::to_string(c.get_int("n_experts")) + ",\n  \"num_experts_per_tok\": " +
                   std::to_string(c.get_int("top_k")) + ",\n  \"router_aux_loss_coef\": " + json_number(c.get_float("router_aux_loss_coef")) +
                   ",\n  \"output_router_logits\": false,\n  \"router_jitter_noise\": 0.0,\n" + window_json
             : hub_model_type(c) == "mistral" ? window_json
                                               : "";
    return "{\n  \"architectures\": [\"" + hub_architecture(c) + "\"],\n  \"model_type\": \"" + hub_model_type(c) +
           "\",\n" + experts + "  \"vocab_size\": " +
           std::to_string(c.get_int("vocab_size")) + ",\n  \"hidden_size\": " + std::to_string(d) +
           ",\n  \"intermediate_size\": " + std::to_string(hidden) + ",\n  \"num_hidden_layers\": " +
           std::to_string(c.get_int("n_layer")) + ",\n  \"num_attention_heads\": " + std::to_string(c.get_int("n_head")) +
           ",\n  \"num_key_value_heads\": " + std::to_string(c.get_int("n_kv_head")) + ",\n  \"max_position_embeddings\": " +
           std::to_string(max_positions(c)) + ",\n  \"rms_norm_eps\": " + json_number(c.get_float("norm_eps")) +
           ",\n  " + rope_config_json(c) + ",\n  \"hidden_act\": \"silu\",\n" +
           (qkv_bias(c) ? "  \"use_sliding_window\": false,\n" : "  \"attention_bias\": false,\n  \"mlp_bias\": false,\n") + "  \"tie_word_embeddings\": " +
           (c.get_bool("tie_embeddings") ? "true" : "false") + "\n}\n";
  }

 private:
  // [model] init_from's config.json (hf_config_check.h): LlamaConfig's / MixtralConfig's keys and
  // defaults (Mistral's checkpoints are Llama's with a sliding window).
  void check_hf_config(const Config& c, HfConfigCheck& hf) const {
    if (!moe_) hf.implies("qkv_bias", hf.value("model_type") == "qwen2");  // Qwen2's checkpoints are Llama's with q/k/v biases
    if (moe_) hf.model_type({"mixtral"}, "mixtral (MixtralForCausalLM)", name());
    else if (qkv_bias(c)) hf.model_type({"qwen2"}, "qwen2 (Qwen2ForCausalLM, [model] qkv_bias = true)", name());
    else hf.model_type({"llama", "mistral"}, "llama (LlamaForCausalLM) or mistral ([model] qkv_bias = true loads qwen2)", name());
    hf.same("n_layer", "num_hidden_layers");
    hf.same("n_head", "num_attention_heads");
    hf.same("n_kv_head", "num_key_value_heads", hf.value("num_attention_heads"));  // absent: one kv head per head
    hf.same("d_model", "hidden_size");
    const int64_t d = c.get_int("d_model"), heads = c.get_int("n_head");
    const int64_t hidden = c.get_int("ffn_hidden") > 0 ? c.get_int("ffn_hidden") : llama_hidden(d);
    hf.same_derived(moe_ ? "each expert's SwiGLU width" : "the SwiGLU width", hidden, "ffn_hidden", "intermediate_size", std::nullopt,
                    /*key_sets_it=*/true);
    hf.same_derived("the head size, d_model / n_head,", d / heads, "n_head", "head_dim", std::nullopt);
    hf.same("vocab_size", "vocab_size");
    hf.same("norm_eps", "rms_norm_eps", moe_ ? 1e-5 : 1e-6);
    check_rope(c, hf, moe_ ? 1e6 : 1e4);
    hf.same("tie_embeddings", "tie_word_embeddings", false);
    hf.context("max_position_embeddings", /*learned_rows=*/false);
    if (hf.value("model_type") == "qwen2") {  // Qwen2's window applies only with use_sliding_window, and to some layers
      if (hf.value("use_sliding_window") == true) hf.not_computed("use_sliding_window = true (windows in some layers)");
      for (const auto& type : hf.value("layer_types"))
        if (type != "full_attention") return hf.not_computed("layer_types with " + type.dump() + " (windows in some layers)");
    } else {
      hf.same("sliding_window", "sliding_window");  // a window the weights were trained with (null: none)
    }
    hf.off_unless("hidden_act", "silu", "an MLP activation other than SiLU");
    hf.off_unless("attention_bias", false, "biases in the attention projections");
    hf.off_unless("mlp_bias", false, "biases in the MLP");
    if (moe_) {
      hf.same("n_experts", "num_local_experts", 8);
      hf.same("top_k", "num_experts_per_tok", 2);
    }
  }

  // The transformers model a checkpoint of this [model] is: Mixtral (with or without a sliding
  // window), Qwen2 (q/k/v biases), Mistral (Llama's layers with a sliding window: a query at p sees
  // keys p - N + 1 .. p, as here) or Llama.
  std::string hub_architecture(const Config& c) const {
    const std::string type = hub_model_type(c);
    return type == "mixtral" ? "MixtralForCausalLM" : type == "qwen2" ? "Qwen2ForCausalLM" : type == "mistral" ? "MistralForCausalLM" : "LlamaForCausalLM";
  }
  std::string hub_model_type(const Config& c) const {
    return moe_ ? "mixtral" : qkv_bias(c) ? "qwen2" : c.get_int("sliding_window") > 0 ? "mistral" : "llama";
  }
  void require_hub_layout(const Config& c) const {
    if (qkv_bias(c)) require_no_sliding_window(c, hub_architecture(c));  // Qwen2's windows cover some layers only
    if (moe_) require_hub_mixtral(c);
  }

  bool moe_;
  // The rotary frequencies some checkpoints store, and a tied model's copy of the embedding, have
  // no parameter; Mixtral's experts are stored one tensor each.
  HfLayout hf_layout(const Config& c) const {
    const bool tied = c.get_bool("tie_embeddings");
    auto ignored = tied ? +[](const std::string& n) { return n == "lm_head.weight" || n.ends_with("rotary_emb.inv_freq"); }
                        : +[](const std::string& n) { return n.ends_with("rotary_emb.inv_freq"); };
    return {hf_name, ignored, moe_ ? c.get_int("n_experts") : 0, nullptr, "model.", tied ? "lm_head.weight" : nullptr, "model.embed_tokens.weight"};
  }

  // embed.embed_tokens -> model.embed_tokens, layersN.x -> model.layers.N.x, head.norm ->
  // model.norm, head.lm_head -> lm_head. q/k use the rotate-half layout on both sides.
  static HfName hf_name(const std::string& n) {
    if (n.starts_with("embed.")) return {"model." + n.substr(6)};
    if (n == "head.lm_head.weight") return {"lm_head.weight"};
    if (n.starts_with("head.")) return {"model." + n.substr(5)};
    const size_t dot = n.find('.');
    return {"model.layers." + n.substr(6, dot - 6) + n.substr(dot)};
  }
};

}  // namespace

std::unique_ptr<ModelFactory> make_llama() { return std::make_unique<Llama>(false); }
std::unique_ptr<ModelFactory> make_mixtral() { return std::make_unique<Llama>(true); }

}  // namespace strata::models
