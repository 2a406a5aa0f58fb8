// Model factories: GPT-2 and Llama architectures, configured by [model].
#include "strata/plugin.h"

namespace strata::models {
namespace {

void check_heads(const Config& config, const SourcePos& section, Diagnostics& diagnostics) {
  if (config.get_int("d_model") % config.get_int("n_head") != 0)
    diagnostics.error(section, "[model] d_model (" + std::to_string(config.get_int("d_model")) +
                                   ") must be divisible by n_head (" + std::to_string(config.get_int("n_head")) + ")");
}

class Gpt final : public Component {
 public:
  Gpt()
      : Component({ComponentKind::Model, "gpt", "GPT-2 architecture: learned positions, pre-LayerNorm, GELU, tied embeddings",
                   Schema()
                       .integer("n_layer", 12, "Transformer blocks", at_least(1))
                       .integer("n_head", 12, "Attention heads", at_least(1))
                       .integer("d_model", 768, "Hidden size", at_least(1))
                       .integer("vocab_size", 50257, "Vocabulary size", at_least(1))
                       .integer("seq_len", 1024, "Context length (learned positions)", at_least(1))
                       .real("dropout", 0.0, "Dropout probability", between(0, 1))
                       .boolean("bias", true, "Biases in Linear and LayerNorm layers")
                       .string("init_from", "", "Hugging Face style model.safetensors to start from; empty = random init")}) {}

  void validate(const Config& config, const SourcePos& section, Diagnostics& diagnostics) const override {
    check_heads(config, section, diagnostics);
  }
};

class Llama final : public Component {
 public:
  Llama()
      : Component({ComponentKind::Model, "llama", "Llama architecture: RMSNorm, RoPE, SwiGLU, grouped-query attention",
                   Schema()
                       .integer("n_layer", 16, "Transformer blocks", at_least(1))
                       .integer("n_head", 16, "Query heads", at_least(1))
                       .integer("n_kv_head", 16, "Key/value heads (grouped-query attention)", at_least(1))
                       .integer("d_model", 2048, "Hidden size", at_least(1))
                       .integer("ffn_hidden", 0, "SwiGLU hidden size; 0 = the Llama rule from d_model", at_least(0))
                       .integer("vocab_size", 32000, "Vocabulary size", at_least(1))
                       .integer("seq_len", 2048, "Context length", at_least(1))
                       .real("rope_theta", 10000.0, "RoPE base frequency", at_least(1))
                       .real("norm_eps", 1e-5, "RMSNorm epsilon", between(0, 1))
                       .boolean("tie_embeddings", false, "Share the input embedding with the output head")
                       .string("init_from", "", "Hugging Face style model.safetensors to start from; empty = random init")}) {}

  void validate(const Config& config, const SourcePos& section, Diagnostics& diagnostics) const override {
    check_heads(config, section, diagnostics);
    if (config.get_int("n_head") % config.get_int("n_kv_head") != 0)
      diagnostics.error(section, "[model] n_head (" + std::to_string(config.get_int("n_head")) +
                                     ") must be a multiple of n_kv_head (" + std::to_string(config.get_int("n_kv_head")) + ")");
  }
};

void register_components(Registry& registry) {
  registry.add(std::make_unique<Gpt>());
  registry.add(std::make_unique<Llama>());
}

}  // namespace
}  // namespace strata::models

STRATA_PLUGIN("models", "0.1.0", strata::models::register_components)
