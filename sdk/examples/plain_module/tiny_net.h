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

}  // namespace plain_module
