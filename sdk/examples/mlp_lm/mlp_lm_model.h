// A program's own model in Strata's IR, for the library API (docs/library.md): a residual-MLP
// language model. Token embedding, residual MLP blocks whose Linear layers say how they split
// (Column then Row, Megatron's MLP pair, so the tensor_parallel pass splits them), a norm and an
// output projection kept whole (the tensor_parallel loss then sees every vocabulary column).
// With token_mixing = true each block first mixes positions, as an MLP-Mixer does but causally
// (a learned [T, T] lower-triangular mixing, a transformer variant without attention): whole on
// every tensor rank, in the replicated region, so tensor parallel splits only the channel MLP
// (its norm is not a Sequence norm: sequence parallel, which would split the positions it mixes,
// is refused when the pass applies).
#pragma once

#include <memory>
#include <string>

#include "strata/errors.h"
#include "strata/model.h"
#include "strata/ops.h"

namespace mlp_lm {

using namespace strata;

// A program's own model in Strata's IR: token embedding, residual MLP blocks whose Linear layers
// say how they split (so tensor parallel applies), a norm and an output projection.
class ResidualMlp final : public nn::Block {
 public:
  ResidualMlp(int64_t d, nn::TensorShard shard) : Block("block") {
    norm = register_module("norm", std::make_shared<nn::LayerNorm>(d, true, 1e-5, nn::ParallelStyle::Sequence));
    up = register_module("up", std::make_shared<nn::Linear>(d, 4 * d, true, nn::ParallelStyle::Column, shard));
    down = register_module("down", std::make_shared<nn::Linear>(4 * d, d, true, nn::ParallelStyle::Row, shard));
  }
  at::Tensor forward(const at::Tensor& x) override { return x + down->forward(ops::gelu(up->forward(norm->forward(x)))); }
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::Linear> up, down;
};

// Causal token mixing: y[b, t] = sum_{s <= t} w[t, s] h[b, s] + bias[t], h = norm(x), residual.
class CausalTokenMixing final : public torch::nn::Module {
 public:
  CausalTokenMixing(int64_t d, int64_t seq_len) {
    norm = register_module("norm", std::make_shared<nn::LayerNorm>(d, true));
    weight = register_parameter("weight", at::eye(seq_len) + 0.02 * at::randn({seq_len, seq_len}));
    bias = register_parameter("bias", at::zeros({seq_len, 1}));
  }
  at::Tensor forward(const at::Tensor& x) {
    const int64_t t = x.size(-2);  // a window may be shorter than seq_len (evaluation): its leading positions
    const at::Tensor w = weight.narrow(0, 0, t).narrow(1, 0, t).tril();
    return x + at::matmul(w, norm->forward(x)) + bias.narrow(0, 0, t);
  }
  std::shared_ptr<nn::LayerNorm> norm;
  at::Tensor weight, bias;
};

// A mixer block: token mixing (when given), then the channel MLP.
class MixerBlock final : public nn::Block {
 public:
  MixerBlock(int64_t d, int64_t seq_len, nn::TensorShard shard) : Block("block") {
    tokens = register_module("tokens", std::make_shared<CausalTokenMixing>(d, seq_len));
    channels = register_module("channels", std::make_shared<ResidualMlp>(d, shard));
  }
  at::Tensor forward(const at::Tensor& x) override { return channels->forward(tokens->forward(x)); }
  std::shared_ptr<CausalTokenMixing> tokens;
  std::shared_ptr<ResidualMlp> channels;
};

class Embed final : public nn::Block {
 public:
  Embed(int64_t vocab, int64_t d) : Block("embedding") { table = register_module("table", std::make_shared<nn::Embedding>(vocab, d)); }
  at::Tensor forward(const at::Tensor& tokens) override { return table->forward(tokens); }
  std::shared_ptr<nn::Embedding> table;
};

class Head final : public nn::Block {
 public:
  Head(int64_t d, int64_t vocab) : Block("head") {
    norm = register_module("norm", std::make_shared<nn::LayerNorm>(d, true));
    out = register_module("out", std::make_shared<nn::Linear>(d, vocab, false));
  }
  at::Tensor forward(const at::Tensor& x) override { return out->forward(norm->forward(x)); }
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::Linear> out;
};

class MlpLanguageModel final : public ModelFactory {
 public:
  MlpLanguageModel()
      : ModelFactory({ComponentKind::Model, "mlp_lm", "a program's residual-MLP language model",
                      Schema()
                          .integer("layers", 2, "residual MLP blocks", between(1, 1 << 10))
                          .integer("width", 16, "hidden size", between(1, 1 << 16))
                          .integer("vocab_size", 32, "vocabulary size", between(1, 1 << 24))
                          .integer("seq_len", 8, "tokens per window", between(1, 1 << 20))
                          .boolean("token_mixing", false, "causal MLP-Mixer blocks: mix positions before each channel MLP")}) {}
  std::shared_ptr<nn::Model> create(const Config& c) const override { return create_shard(c, {}); }
  std::string split_problem(const Config& c, int64_t parts) const override {
    return 4 * c.get_int("width") % parts == 0 ? "" : "[model] 4 x width does not divide by the tensor size";
  }
  std::shared_ptr<nn::Model> create_shard(const Config& c, nn::TensorShard shard) const override {
    const int64_t vocab = c.get_int("vocab_size"), d = c.get_int("width");
    if (const std::string problem = split_problem(c, shard.parts); !problem.empty()) throw UserError(problem);
    auto model = std::make_shared<nn::Model>(vocab, c.get_int("seq_len"));
    model->add_block("embed", std::make_shared<Embed>(vocab, d));
    for (int64_t i = 0; i < c.get_int("layers"); ++i) {
      std::shared_ptr<nn::Block> block;
      if (c.get_bool("token_mixing")) block = std::make_shared<MixerBlock>(d, c.get_int("seq_len"), shard);
      else block = std::make_shared<ResidualMlp>(d, shard);
      model->add_block(std::string("h") + std::to_string(i), block);  // (not "h" + ...: a GCC 12 false -Wstringop-overflow)
    }
    model->add_block("head", std::make_shared<Head>(d, vocab));
    return model;
  }
};

}  // namespace mlp_lm
