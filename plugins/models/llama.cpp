// Llama: RMSNorm, rotary position embedding (rotate-half layout), SwiGLU MLP, grouped-query
// attention, no biases.
#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>

#include "models.h"

namespace strata::models {
namespace {

class Embed final : public nn::Block {
 public:
  // Vocab parallel under tensor parallel: each rank holds its rows.
  Embed(int64_t vocab, int64_t d_model, nn::TensorShard shard) : Block("embedding") {
    embed_tokens = register_module("embed_tokens", std::make_shared<nn::Embedding>(vocab, d_model, nn::ParallelStyle::Column, shard));
  }
  at::Tensor forward(const at::Tensor& tokens) override { return embed_tokens->forward(tokens); }
  std::shared_ptr<nn::Embedding> embed_tokens;
};

// Under tensor parallel q and o split by heads; k and v split too when the kv heads divide by
// the tensor size, and stay whole otherwise (each rank then picks the kv heads of its q heads).
class Attention final : public torch::nn::Module {
 public:
  Attention(int64_t d_model, int64_t n_head, int64_t n_kv_head, double rope_theta, nn::TensorShard shard)
      : n_head_(n_head), n_kv_head_(n_kv_head), head_dim_(d_model / n_head), rope_theta_(rope_theta), shard_(shard) {
    const bool split_kv = n_kv_head % shard.parts == 0;
    const nn::ParallelStyle kv_style =
        split_kv ? nn::ParallelStyle::Column : shard.parts > 1 ? nn::ParallelStyle::Replicated : nn::ParallelStyle::None;
    q_proj = register_module("q_proj", std::make_shared<nn::Linear>(d_model, n_head * head_dim_, false, nn::ParallelStyle::Column, shard));
    k_proj = register_module("k_proj", std::make_shared<nn::Linear>(d_model, n_kv_head * head_dim_, false, kv_style, shard));
    v_proj = register_module("v_proj", std::make_shared<nn::Linear>(d_model, n_kv_head * head_dim_, false, kv_style, shard));
    o_proj = register_module("o_proj", std::make_shared<nn::Linear>(n_head * head_dim_, d_model, false, nn::ParallelStyle::Row, shard));
    core = register_module("core", std::make_shared<nn::AttentionCore>(/*causal=*/true));
  }

  at::Tensor forward(const at::Tensor& x) {
    const int64_t b = x.size(0), t = x.size(1);
    auto heads = [&](const at::Tensor& y) { return y.view({b, t, y.size(-1) / head_dim_, head_dim_}).transpose(1, 2); };
    auto [cos, sin] = rope_tables(t, x.device(), nn::current_sequence());
    at::Tensor q = ops::rope(heads(q_proj->forward(x)), cos, sin);
    at::Tensor k = ops::rope(heads(k_proj->forward(x)), cos, sin);
    at::Tensor v = heads(v_proj->forward(x));
    if (k_proj->parallel_style == nn::ParallelStyle::Replicated) {
      // Whole kv heads: one per local q head, the one its global q head uses.
      const int64_t local_q = q.size(1), group = n_head_ / n_kv_head_;
      k = k.repeat_interleave(group, 1).narrow(1, shard_.index * local_q, local_q);
      v = v.repeat_interleave(group, 1).narrow(1, shard_.index * local_q, local_q);
    }
    at::Tensor y = core->forward(q, k, v);
    return o_proj->forward(y.transpose(1, 2).reshape({b, t, q.size(1) * head_dim_}));
  }

  std::shared_ptr<nn::Linear> q_proj, k_proj, v_proj, o_proj;
  std::shared_ptr<nn::AttentionCore> core;

 private:
  // cos/sin of position x inverse frequency for this rank's t tokens: [t, head_dim / 2], or
  // [B, 1, t, head_dim / 2] when positions differ per sequence (packed documents). The table is
  // computed in fp32 for the whole window and cached.
  std::pair<at::Tensor, at::Tensor> rope_tables(int64_t t, const at::Device& device, const nn::SequenceLayout& sequence) {
    const int64_t window = std::max(t, sequence.window);
    if (!cos_.defined() || cos_.size(0) < window || cos_.device() != device) {
      auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
      at::Tensor inv_freq = at::pow(rope_theta_, -at::arange(0, head_dim_, 2, f32) / static_cast<double>(head_dim_));
      at::Tensor angles = at::outer(at::arange(window, f32), inv_freq);
      cos_ = angles.cos();
      sin_ = angles.sin();
    }
    if (!sequence.positions.defined() && !sequence.token_index.defined()) return {cos_.narrow(0, 0, t), sin_.narrow(0, 0, t)};
    const at::Tensor positions = sequence.position_ids(t, device);
    if (positions.dim() == 1) return {cos_.index_select(0, positions), sin_.index_select(0, positions)};
    return {at::embedding(cos_, positions).unsqueeze(1), at::embedding(sin_, positions).unsqueeze(1)};
  }

  int64_t n_head_, n_kv_head_, head_dim_;
  double rope_theta_;
  nn::TensorShard shard_;
  at::Tensor cos_, sin_;
};

class Mlp final : public torch::nn::Module {
 public:
  Mlp(int64_t d_model, int64_t hidden, nn::TensorShard shard) {
    gate_proj = register_module("gate_proj", std::make_shared<nn::Linear>(d_model, hidden, false, nn::ParallelStyle::Column, shard));
    up_proj = register_module("up_proj", std::make_shared<nn::Linear>(d_model, hidden, false, nn::ParallelStyle::Column, shard));
    down_proj = register_module("down_proj", std::make_shared<nn::Linear>(hidden, d_model, false, nn::ParallelStyle::Row, shard));
  }
  at::Tensor forward(const at::Tensor& x) {
    return down_proj->forward(ops::swiglu(gate_proj->forward(x), up_proj->forward(x)));
  }
  std::shared_ptr<nn::Linear> gate_proj, up_proj, down_proj;
};

class DecoderLayer final : public nn::Block {
 public:
  DecoderLayer(const Config& c, int64_t hidden, nn::TensorShard shard) : Block("block") {
    const int64_t d = c.get_int("d_model");
    const double eps = c.get_float("norm_eps");
    input_layernorm = register_module("input_layernorm", std::make_shared<nn::RmsNorm>(d, eps, nn::ParallelStyle::Sequence));
    self_attn = register_module("self_attn", std::make_shared<Attention>(d, c.get_int("n_head"), c.get_int("n_kv_head"),
                                                                         c.get_float("rope_theta"), shard));
    post_attention_layernorm =
        register_module("post_attention_layernorm", std::make_shared<nn::RmsNorm>(d, eps, nn::ParallelStyle::Sequence));
    mlp = register_module("mlp", std::make_shared<Mlp>(d, hidden, shard));
  }
  at::Tensor forward(const at::Tensor& x) override {
    at::Tensor h = x + self_attn->forward(input_layernorm->forward(x));
    return h + mlp->forward(post_attention_layernorm->forward(h));
  }
  std::shared_ptr<nn::RmsNorm> input_layernorm, post_attention_layernorm;
  std::shared_ptr<Attention> self_attn;
  std::shared_ptr<Mlp> mlp;
};

// The output projection: its own weight, or the token embedding's (tied). Under tensor parallel
// it is split by vocabulary rows, and the logits are this rank's vocabulary columns.
class Head final : public nn::Block {
 public:
  Head(int64_t d_model, int64_t vocab, double eps, std::shared_ptr<nn::Embedding> tied, nn::TensorShard shard) : Block("head") {
    norm = register_module("norm", std::make_shared<nn::RmsNorm>(d_model, eps, nn::ParallelStyle::Sequence));
    if (tied)
      tied_head = register_module("tied_head", std::make_shared<nn::TiedLinear>(std::move(tied)));
    else
      lm_head = register_module("lm_head", std::make_shared<nn::Linear>(d_model, vocab, false, nn::ParallelStyle::Column, shard));
  }
  at::Tensor forward(const at::Tensor& x) override {
    at::Tensor h = norm->forward(x);
    return tied_head ? tied_head->forward(h) : lm_head->forward(h);
  }
  std::shared_ptr<nn::RmsNorm> norm;
  std::shared_ptr<nn::Linear> lm_head;
  std::shared_ptr<nn::TiedLinear> tied_head;
};

// Llama's SwiGLU width: 2/3 of 4 d_model, rounded up to a multiple of 256.
int64_t llama_hidden(int64_t d_model) {
  const int64_t hidden = 2 * (4 * d_model) / 3;
  return (hidden + 255) / 256 * 256;
}

class Llama final : public ModelFactory {
 public:
  Llama()
      : ModelFactory({ComponentKind::Model, "llama", "Llama architecture: RMSNorm, RoPE, SwiGLU, grouped-query attention",
                      add_sliding_window(Schema()
                          .integer("n_layer", 16, "Transformer blocks", between(1, 1 << 14))
                          .integer("n_head", 16, "Query heads", between(1, 1 << 14))
                          .integer("n_kv_head", 16, "Key/value heads (grouped-query attention)", between(1, 1 << 14))
                          .integer("d_model", 2048, "Hidden size", between(1, 1 << 18))
                          .integer("ffn_hidden", 0, "SwiGLU hidden size; 0 = Llama's rule (2/3 of 4 d_model, multiple of 256)", between(0, 1 << 20))
                          .integer("vocab_size", 32000, "Vocabulary size", between(1, 1 << 24))
                          .integer("seq_len", 2048, "Context length", between(1, 1 << 24))
                          .real("rope_theta", 10000.0, "RoPE base frequency", at_least(1))
                          .real("norm_eps", 1e-5, "RMSNorm epsilon", between(0, 1))
                          .boolean("tie_embeddings", false, "Share the input embedding with the output head")
                          .string("init_from", "", "Hugging Face LlamaForCausalLM weights (model.safetensors, its directory, or a sharded index); empty = random init"))}) {}

  void validate(const Config& config, const SourcePos& section, Diagnostics& diagnostics) const override {
    check_heads(config, section, diagnostics);
    if (config.get_int("n_head") % config.get_int("n_kv_head") != 0)
      diagnostics.error(section, "[model] n_head (" + std::to_string(config.get_int("n_head")) +
                                     ") must be a multiple of n_kv_head (" + std::to_string(config.get_int("n_kv_head")) + ")");
    if ((config.get_int("d_model") / config.get_int("n_head")) % 2 != 0)
      diagnostics.error(section, "[model] d_model / n_head must be even for rotary embeddings");
  }

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
    s.layer_parameters = 2 * d + 2 * d * d + 2 * d * kv_width + 3 * d * s.ffn_hidden;
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
    auto model = std::make_shared<nn::Model>(vocab, c.get_int("seq_len"));
    auto embed = std::make_shared<Embed>(vocab, d, shard);
    model->add_block("embed", embed);
    for (int64_t i = 0; i < n_layer; ++i)
      model->add_block("layers" + std::to_string(i), std::make_shared<DecoderLayer>(c, hidden, shard));
    model->add_block("head", std::make_shared<Head>(d, vocab, c.get_float("norm_eps"),
                                                    c.get_bool("tie_embeddings") ? embed->embed_tokens : nullptr, shard));
    if (c.get_bool("tie_embeddings")) model->mark_shared("embed.embed_tokens.weight");
    model->set_attention_shape(n_layer, c.get_int("n_head"), d / c.get_int("n_head"));
    apply_sliding_window(*model, c);
    init_from(*model, *this, c);
    return model;
  }

  NamedTensors to_hf(const nn::Model& model, const Config& c) const override {
    require_no_sliding_window(c, "LlamaForCausalLM");
    return map_to_hf(model, hf_name);
  }

  NamedTensors from_hf(const NamedTensors& hf, const Config& c) const override {
    Config random_init = c;
    random_init.set("init_from", Config::Entry{std::string(), Origin::Default, {}});
    const bool tied = c.get_bool("tie_embeddings");
    auto ignored = tied ? +[](const std::string& n) { return n == "lm_head.weight" || n.ends_with("rotary_emb.inv_freq"); }
                        : +[](const std::string& n) { return n.ends_with("rotary_emb.inv_freq"); };
    return map_from_hf(hf, *create(random_init), hf_name, ignored);
  }

  std::string hf_config_json(const Config& c) const override {
    require_no_sliding_window(c, "LlamaForCausalLM");
    const int64_t d = c.get_int("d_model");
    const int64_t hidden = c.get_int("ffn_hidden") > 0 ? c.get_int("ffn_hidden") : llama_hidden(d);
    return "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n  \"vocab_size\": " +
           std::to_string(c.get_int("vocab_size")) + ",\n  \"hidden_size\": " + std::to_string(d) +
           ",\n  \"intermediate_size\": " + std::to_string(hidden) + ",\n  \"num_hidden_layers\": " +
           std::to_string(c.get_int("n_layer")) + ",\n  \"num_attention_heads\": " + std::to_string(c.get_int("n_head")) +
           ",\n  \"num_key_value_heads\": " + std::to_string(c.get_int("n_kv_head")) + ",\n  \"max_position_embeddings\": " +
           std::to_string(c.get_int("seq_len")) + ",\n  \"rms_norm_eps\": " + json_number(c.get_float("norm_eps")) +
           ",\n  \"rope_theta\": " + json_number(c.get_float("rope_theta")) + ",\n  \"hidden_act\": \"silu\",\n" +
           "  \"attention_bias\": false,\n  \"mlp_bias\": false,\n  \"tie_word_embeddings\": " +
           (c.get_bool("tie_embeddings") ? "true" : "false") + "\n}\n";
  }

 private:
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

std::unique_ptr<ModelFactory> make_llama() { return std::make_unique<Llama>(); }

}  // namespace strata::models
