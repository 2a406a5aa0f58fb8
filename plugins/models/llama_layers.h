// Llama's layers, shared by the models built from them (llama, mixtral): the token embedding,
// grouped-query attention with rotary embeddings, the SwiGLU MLP and the output head.
#pragma once

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>

#include "models.h"
#include "rope_frequencies.h"

namespace strata::models::llama {


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
  // qkv_bias: the q, k and v projections have biases (Qwen2); o never does.
  Attention(int64_t d_model, int64_t n_head, int64_t n_kv_head, RopeFrequencies rope, bool qkv_bias, nn::TensorShard shard)
      : n_head_(n_head), n_kv_head_(n_kv_head), head_dim_(d_model / n_head), rope_(rope), shard_(shard) {
    const bool split_kv = n_kv_head % shard.parts == 0;
    const nn::ParallelStyle kv_style =
        split_kv ? nn::ParallelStyle::Column : shard.parts > 1 ? nn::ParallelStyle::Replicated : nn::ParallelStyle::None;
    q_proj = register_module("q_proj", std::make_shared<nn::Linear>(d_model, n_head * head_dim_, qkv_bias, nn::ParallelStyle::Column, shard));
    k_proj = register_module("k_proj", std::make_shared<nn::Linear>(d_model, n_kv_head * head_dim_, qkv_bias, kv_style, shard));
    v_proj = register_module("v_proj", std::make_shared<nn::Linear>(d_model, n_kv_head * head_dim_, qkv_bias, kv_style, shard));
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
      at::Tensor angles = at::outer(at::arange(window, f32), rope_.inverse(head_dim_, f32));
      cos_ = angles.cos();
      sin_ = angles.sin();
    }
    if (!sequence.positions.defined() && !sequence.token_index.defined()) return {cos_.narrow(0, 0, t), sin_.narrow(0, 0, t)};
    const at::Tensor positions = sequence.position_ids(t, device);
    if (positions.dim() == 1) return {cos_.index_select(0, positions), sin_.index_select(0, positions)};
    return {at::embedding(cos_, positions).unsqueeze(1), at::embedding(sin_, positions).unsqueeze(1)};
  }

  int64_t n_head_, n_kv_head_, head_dim_;
  RopeFrequencies rope_;
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
inline int64_t llama_hidden(int64_t d_model) {
  const int64_t hidden = 2 * (4 * d_model) / 3;
  return (hidden + 255) / 256 * 256;
}

}  // namespace strata::models::llama
