// A plain libtorch module, as a team's own training program would have it: no Strata types.
#pragma once

#include <torch/torch.h>

namespace plain_module {

// Tokens [B, T] -> logits [B, T, vocab]: an embedding, a GELU MLP, an output layer.
struct TinyNet : torch::nn::Module {
  TinyNet(int64_t vocab, int64_t width)
      : embedding(register_module("embedding", torch::nn::Embedding(vocab, width))),
        hidden(register_module("hidden", torch::nn::Linear(width, 4 * width))),
        output(register_module("output", torch::nn::Linear(4 * width, vocab))) {}
  at::Tensor forward(const at::Tensor& tokens) { return output(torch::gelu(hidden(embedding(tokens)))); }

  torch::nn::Embedding embedding;
  torch::nn::Linear hidden, output;
};

// The same network as a Sequential of named children, built in the same order (so from the same
// seed it starts from the same values): Strata makes each child a block of its own.
inline torch::nn::Sequential tiny_sequential(int64_t vocab, int64_t width) {
  return torch::nn::Sequential({{"embedding", torch::nn::Embedding(vocab, width)},
                                {"hidden", torch::nn::Linear(width, 4 * width)},
                                {"gelu", torch::nn::GELU()},
                                {"output", torch::nn::Linear(4 * width, vocab)}});
}

}  // namespace plain_module
