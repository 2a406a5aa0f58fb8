// GPT-2: learned positions, pre-LayerNorm blocks, GELU (tanh) MLP, output head tied to the
// token embedding.
#include <cmath>

#include <ATen/ATen.h>

#include "hf_config_check.h"
#include "models.h"

namespace strata::models {
namespace {

class Embed final : public nn::Block {
 public:
  Embed(int64_t vocab, int64_t positions, int64_t d_model, double dropout, nn::TensorShard shard) : Block("embedding") {
    // Vocab parallel under tensor parallel: each rank holds its rows of the token embedding.
    wte = register_module("wte", std::make_shared<nn::Embedding>(vocab, d_model, nn::ParallelStyle::Column, shard));
    wpe = register_module("wpe", std::make_shared<nn::Embedding>(positions, d_model, nn::ParallelStyle::Sequence));
    drop = register_module("drop", std::make_shared<nn::Dropout>(dropout));
  }
  at::Tensor forward(const at::Tensor& tokens) override {
    // Each token's position in its window (or document): context parallel holds some of them.
    const at::Tensor positions = nn::current_sequence().position_ids(tokens.size(1), tokens.device());
    return drop->forward(wte->forward(tokens) + wpe->forward(positions));
  }
  std::shared_ptr<nn::Embedding> wte, wpe;
  std::shared_ptr<nn::Dropout> drop;
};

// Under tensor parallel, c_attn is split per head (this rank's heads' rows of q, of k and of v)
// and c_proj by its inputs; the local head count follows from c_attn's local width.
class Attention final : public torch::nn::Module {
 public:
  Attention(int64_t d_model, int64_t n_head, bool bias, double dropout, nn::TensorShard shard, double proj_std)
      : head_dim_(d_model / n_head) {
    c_attn = register_module("c_attn", std::make_shared<nn::Linear>(d_model, 3 * d_model, bias, nn::ParallelStyle::Column, shard,
                                                                    0.02, /*fused=*/3));
    c_proj = register_module("c_proj", std::make_shared<nn::Linear>(d_model, d_model, bias, nn::ParallelStyle::Row, shard, proj_std));
    resid_drop = register_module("resid_drop", std::make_shared<nn::Dropout>(dropout));
    core = register_module("core", std::make_shared<nn::AttentionCore>(/*causal=*/true));
  }
  at::Tensor forward(const at::Tensor& x) {
    const int64_t b = x.size(0), t = x.size(1);
    at::Tensor fused = c_attn->forward(x);
    const int64_t local = fused.size(-1) / 3;  // this rank's heads x head_dim
    auto heads = [&](const at::Tensor& y) { return y.view({b, t, local / head_dim_, head_dim_}).transpose(1, 2); };
    std::vector<at::Tensor> qkv = fused.split(local, -1);
    at::Tensor y = core->forward(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]));
    y = y.transpose(1, 2).reshape({b, t, local});
    return resid_drop->forward(c_proj->forward(y));
  }
  std::shared_ptr<nn::Linear> c_attn, c_proj;
  std::shared_ptr<nn::Dropout> resid_drop;
  std::shared_ptr<nn::AttentionCore> core;

 private:
  int64_t head_dim_;
};

class Mlp final : public torch::nn::Module {
 public:
  Mlp(int64_t d_model, bool bias, double dropout, nn::TensorShard shard, double proj_std) {
    c_fc = register_module("c_fc", std::make_shared<nn::Linear>(d_model, 4 * d_model, bias, nn::ParallelStyle::Column, shard));
    c_proj = register_module("c_proj", std::make_shared<nn::Linear>(4 * d_model, d_model, bias, nn::ParallelStyle::Row, shard, proj_std));
    resid_drop = register_module("resid_drop", std::make_shared<nn::Dropout>(dropout));
  }
  at::Tensor forward(const at::Tensor& x) { return resid_drop->forward(c_proj->forward(ops::gelu(c_fc->forward(x)))); }
  std::shared_ptr<nn::Linear> c_fc, c_proj;
  std::shared_ptr<nn::Dropout> resid_drop;
};

class TransformerBlock final : public nn::Block {
 public:
  TransformerBlock(int64_t d_model, int64_t n_head, bool bias, double dropout, nn::TensorShard shard, double proj_std) : Block("block") {
    ln_1 = register_module("ln_1", std::make_shared<nn::LayerNorm>(d_model, bias, 1e-5, nn::ParallelStyle::Sequence));
    attn = register_module("attn", std::make_shared<Attention>(d_model, n_head, bias, dropout, shard, proj_std));
    ln_2 = register_module("ln_2", std::make_shared<nn::LayerNorm>(d_model, bias, 1e-5, nn::ParallelStyle::Sequence));
    mlp = register_module("mlp", std::make_shared<Mlp>(d_model, bias, dropout, shard, proj_std));
  }
  at::Tensor forward(const at::Tensor& x) override {
    // h = x + attn(ln_1(x)) and ln_2(h) in one operator (add_layer_norm), which a kernel may fuse.
    const ops::AddNormResult h = ln_2->forward_residual(x, attn->forward(ln_1->forward(x)));
    return h.sum + mlp->forward(h.normed);
  }
  std::shared_ptr<nn::LayerNorm> ln_1, ln_2;
  std::shared_ptr<Attention> attn;
  std::shared_ptr<Mlp> mlp;
};

// The output projection reuses the token embedding (TiedLinear holds it without registering it),
// so the optimizer and checkpoints see the tensor once, as embed.wte.weight. Under tensor
// parallel the logits are this rank's vocabulary columns.
class Head final : public nn::Block {
 public:
  Head(int64_t d_model, bool bias, std::shared_ptr<nn::Embedding> tied) : Block("head") {
    ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(d_model, bias, 1e-5, nn::ParallelStyle::Sequence));
    lm_head = register_module("lm_head", std::make_shared<nn::TiedLinear>(std::move(tied)));
  }
  at::Tensor forward(const at::Tensor& x) override { return lm_head->forward(ln_f->forward(x)); }
  std::shared_ptr<nn::LayerNorm> ln_f;
  std::shared_ptr<nn::TiedLinear> lm_head;
};

class Gpt final : public ModelFactory, public DerivesDefaults, public LoadsHfModelTypes {
 public:
  Gpt()
      : ModelFactory({ComponentKind::Model, "gpt", "GPT-2 architecture: learned positions, pre-LayerNorm, GELU, tied embeddings",
                      add_max_positions(add_sliding_window(Schema()
                          .integer("n_layer", 12, "Transformer blocks", between(1, 1 << 14))
                          .integer("n_head", 12, "Attention heads", between(1, 1 << 14))
                          .integer("d_model", 768, "Hidden size", between(1, 1 << 18))
                          .integer("vocab_size", 50257, "Vocabulary size", between(1, 1 << 24))
                          .integer("seq_len", 1024, "Context length trained on (learned positions)", between(1, 1 << 24))
                          .real("dropout", 0.0, "Dropout probability", between(0, 1))
                          .boolean("bias", true, "Biases in Linear and LayerNorm layers")
                          .string("init_from", "", "Hugging Face GPT2LMHeadModel weights (model.safetensors or its directory; relative: to the working directory); the [model] keys left unset take the values of the config.json beside them, the ones set are checked against it; empty = random init")))}) {}

  void validate(const Config& config, const SourcePos& section, Diagnostics& diagnostics) const override {
    check_heads(config, section, diagnostics);
    check_max_positions(config, diagnostics);
    HfConfigCheck hf(config, section, diagnostics);
    if (hf) check_hf_config(config, hf);
  }

  // The [model] keys a strategy leaves unset take the values of the weights' config.json.
  std::vector<Derived> derived_defaults(const Config& config) const override {
    return HfConfigCheck::derived(config, [&](HfConfigCheck& hf) { check_hf_config(config, hf); });
  }
  std::vector<std::string> hf_model_types() const override { return hf_model_types_of(name()); }

  std::shared_ptr<nn::Model> create(const Config& c) const override { return create_shard(c, {}); }

  // Whole heads per rank (so c_attn, c_proj and the 4 x d_model MLP split too); the vocabulary
  // splits unevenly when it must (nn::shard_range).
  std::string split_problem(const Config& c, int64_t parts) const override {
    if (c.get_int("n_head") % parts != 0)
      return "[model] n_head " + std::to_string(c.get_int("n_head")) + " does not divide by [parallel] tensor = " + std::to_string(parts);
    if (c.get_int("vocab_size") < parts)
      return "[model] vocab_size " + std::to_string(c.get_int("vocab_size")) + " is smaller than [parallel] tensor = " + std::to_string(parts);
    return {};
  }

  ModelShape shape(const Config& c) const override {
    ModelShape s;
    s.layers = c.get_int("n_layer"), s.hidden = c.get_int("d_model"), s.heads = s.kv_heads = c.get_int("n_head");
    s.ffn_hidden = 4 * s.hidden, s.seq_len = c.get_int("seq_len"), s.vocab = c.get_int("vocab_size");
    const int64_t d = s.hidden, b = c.get_bool("bias") ? 1 : 0;
    // Two LayerNorms, c_attn (d x 3d), c_proj (d x d), the MLP (d x 4d, 4d x d), with their biases.
    s.layer_parameters = 12 * d * d + (2 + 11 * b) * d;
    // Tied token embedding, learned positions, the final LayerNorm.
    s.parameters = s.layers * s.layer_parameters + (s.vocab + max_positions(c)) * d + (1 + b) * d;
    s.blocks = s.layers + 2;  // embed, h0.., head
    return s;
  }

  std::string describe_split(const Config& c, int64_t parts) const override {
    const int64_t heads = c.get_int("n_head"), d = c.get_int("d_model"), vocab = c.get_int("vocab_size");
    return "attention: " + std::to_string(heads / parts) + " of " + std::to_string(heads) + " heads per rank (c_attn per head, c_proj by rows)\n" +
           "mlp: " + std::to_string(4 * d / parts) + " of " + std::to_string(4 * d) + " hidden columns per rank\n" +
           vocab_line(vocab, parts) + " (token embedding and tied head)\n";
  }

  // Attention and MLP split over the tensor ranks (whole heads each), the token embedding and the
  // tied head by vocabulary rows; positions and norms stay whole.
  std::shared_ptr<nn::Model> create_shard(const Config& c, nn::TensorShard shard) const override {
    const int64_t n_layer = c.get_int("n_layer"), d = c.get_int("d_model"), heads = c.get_int("n_head");
    if (const std::string problem = split_problem(c, shard.parts); !problem.empty()) throw UserError(problem);
    const bool bias = c.get_bool("bias");
    const double dropout = c.get_float("dropout");
    if (!c.get_string("init_from").empty()) require_hf_compatible(c);
    InitFrom loading(c, hf_layout());
    auto model = std::make_shared<nn::Model>(c.get_int("vocab_size"), c.get_int("seq_len"));
    auto embed = std::make_shared<Embed>(c.get_int("vocab_size"), max_positions(c), d, dropout, shard);
    model->add_block("embed", embed);
    // GPT-2 scales residual projections by 1/sqrt(2 n_layer) so the residual stream's variance
    // does not grow with depth.
    const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(n_layer));
    for (int64_t i = 0; i < n_layer; ++i)
      // (std::string("h") + ...: GCC 12's "h" + std::string&& trips a false -Wstringop-overflow.)
      model->add_block(std::string("h") + std::to_string(i), std::make_shared<TransformerBlock>(d, heads, bias, dropout, shard, proj_std));
    model->add_block("head", std::make_shared<Head>(d, bias, embed->wte));
    model->mark_shared("embed.wte.weight");
    model->set_attention_shape(n_layer, heads, d / heads);
    apply_sliding_window(*model, c);
    loading.finish(*model);
    return model;
  }

  NamedTensors to_hf(const nn::Model& model, const Config& c) const override {
    require_hf_compatible(c);
    require_no_sliding_window(c, "GPT2LMHeadModel");
    return map_to_hf(model, hf_name);
  }

  NamedTensors from_hf(const NamedTensors& hf, const Config& c) const override {
    require_hf_compatible(c);
    return map_from_hf(hf, *whole_model(*this, c), hf_layout());
  }

  std::string hf_config_json(const Config& c) const override {
    require_hf_compatible(c);
    require_no_sliding_window(c, "GPT2LMHeadModel");
    const std::string dropout = json_number(c.get_float("dropout"));
    return "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n  \"vocab_size\": " +
           std::to_string(c.get_int("vocab_size")) + ",\n  \"n_positions\": " + std::to_string(max_positions(c)) +
           ",\n  \"n_embd\": " + std::to_string(c.get_int("d_model")) + ",\n  \"n_layer\": " + std::to_string(c.get_int("n_layer")) +
           ",\n  \"n_head\": " + std::to_string(c.get_int("n_head")) + ",\n  \"activation_function\": \"gelu_new\",\n" +
           "  \"layer_norm_epsilon\": 1e-05,\n  \"resid_pdrop\": " + dropout + ",\n  \"embd_pdrop\": " + dropout +
           ",\n  \"attn_pdrop\": " + dropout + ",\n  \"tie_word_embeddings\": true\n}\n";
  }

 private:
  // [model] init_from's config.json (hf_config_check.h): GPT2Config's keys and defaults.
  void check_hf_config(const Config& c, HfConfigCheck& hf) const {
    hf.model_type({"gpt2"}, "gpt2 (GPT2LMHeadModel)", name());
    hf.same("n_layer", "n_layer");
    hf.same("n_head", "n_head");
    hf.same("d_model", "n_embd");
    hf.same("vocab_size", "vocab_size");
    // The learned position table: the model may take its first rows, not more than it has.
    hf.context("n_positions", /*learned_rows=*/true);
    const int64_t width = 4 * c.get_int("d_model");
    hf.same_derived("the MLP width, 4 x d_model,", width, "d_model", "n_inner", width);
    hf.off_unless("activation_function", "gelu_new", "a GELU other than the tanh approximation");
    hf.off_unless("layer_norm_epsilon", 1e-5, "a LayerNorm epsilon other than 1e-5");
    hf.off_unless("tie_word_embeddings", true, "an output head apart from the token embedding");
    hf.off_unless("scale_attn_weights", true, "attention scores not scaled by 1/sqrt(head size)");
    hf.off_unless("scale_attn_by_inverse_layer_idx", false, "attention scores scaled by layer");
    hf.off_unless("reorder_and_upcast_attn", false, "attention reordered and upcast");
  }

  static void require_hf_compatible(const Config& c) {
    if (!c.get_bool("bias")) throw UserError("GPT2LMHeadModel always has biases; a [model] bias = false GPT cannot move to or from it");
  }

  static HfLayout hf_layout() {
    // The tied output weight (a copy of wte, checked), and the causal-mask buffers older checkpoints
    // store, have no parameter.
    // A table shorter than the checkpoint's n_positions takes its first positions (nanoGPT's crop_block_size).
    return {hf_name, [](const std::string& n) { return n == "lm_head.weight" || n.ends_with(".attn.bias") || n.ends_with(".attn.masked_bias"); },
            0, [](const std::string& n) { return n == "embed.wpe.weight"; }, "transformer.", "lm_head.weight", "transformer.wte.weight"};
  }

  // embed.wte -> transformer.wte, hN.x -> transformer.h.N.x, head.ln_f -> transformer.ln_f; the
  // attention and MLP weights are Conv1D in GPT-2, stored transposed.
  static HfName hf_name(const std::string& n) {
    if (n.starts_with("embed.")) return {"transformer." + n.substr(6)};
    if (n.starts_with("head.")) return {"transformer." + n.substr(5)};
    const size_t dot = n.find('.');
    const std::string rest = n.substr(dot + 1);
    const bool conv1d = rest.ends_with(".weight") && (rest.find("c_attn") != std::string::npos ||
                                                      rest.find("c_proj") != std::string::npos || rest.find("c_fc") != std::string::npos);
    return {"transformer.h." + n.substr(1, dot - 1) + "." + rest, conv1d};
  }
};

}  // namespace

std::unique_ptr<ModelFactory> make_gpt() { return std::make_unique<Gpt>(); }

}  // namespace strata::models
