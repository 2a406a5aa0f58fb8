// The model IR: a model is an ordered sequence of named blocks with one activation interface
// (a tensor in, a tensor out), built from Strata layers that call operators from strata/ops.h.
// Block boundaries are where passes wrap (fsdp), cut (pipeline) and recompute (act_checkpoint).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "strata/export.h"

namespace strata::nn {

// Set by tensor parallel on layers it splits; None means replicated.
enum class ParallelStyle { None, Column, Row, Sequence };

class STRATA_API Linear : public torch::nn::Module {
 public:
  Linear(int64_t in, int64_t out, bool bias);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;  // [out, in]
  at::Tensor bias;    // [out] or undefined
  ParallelStyle parallel_style = ParallelStyle::None;
};

class STRATA_API Embedding : public torch::nn::Module {
 public:
  Embedding(int64_t count, int64_t dim);
  at::Tensor forward(const at::Tensor& ids);
  at::Tensor weight;  // [count, dim]
  ParallelStyle parallel_style = ParallelStyle::None;
};

class STRATA_API LayerNorm : public torch::nn::Module {
 public:
  LayerNorm(int64_t dim, bool bias, double eps = 1e-5);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight, bias;
  double eps;
};

class STRATA_API RmsNorm : public torch::nn::Module {
 public:
  RmsNorm(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;
  double eps;
};

// A block: the unit passes address by name and by type ("embedding", "block", "head", ...).
class STRATA_API Block : public torch::nn::Module {
 public:
  explicit Block(std::string type) : type_(std::move(type)) {}
  ~Block() override;
  const std::string& type() const { return type_; }
  virtual at::Tensor forward(const at::Tensor& x) = 0;

 private:
  std::string type_;
};

// How a block is run; passes replace it to wrap the call (gather parameters, recompute, ...).
using BlockExecutor = std::function<at::Tensor(Block& block, const at::Tensor& x)>;
// Pre-forward hooks receive the block's input, post-forward hooks its output.
using BlockHook = std::function<void(Block& block, const at::Tensor& x)>;

class STRATA_API Model : public torch::nn::Module {
 public:
  Model(int64_t vocab_size, int64_t seq_len);
  ~Model() override;

  void add_block(const std::string& name, std::shared_ptr<Block> block);
  size_t num_blocks() const { return blocks_.size(); }
  Block& block(size_t i) const { return *blocks_.at(i).block; }
  const std::string& block_name(size_t i) const { return blocks_.at(i).name; }
  // Blocks whose type or name is in `selectors`, in model order.
  std::vector<size_t> find_blocks(const std::vector<std::string>& selectors) const;

  void set_executor(size_t i, BlockExecutor executor);
  void add_pre_forward_hook(size_t i, BlockHook hook);
  void add_post_forward_hook(size_t i, BlockHook hook);

  // Declares a parameter that blocks other than its owner also read (tied weights), so passes
  // that free a block's parameters between uses (fsdp) keep it.
  void mark_shared(const std::string& parameter_name) { shared_.push_back(parameter_name); }
  const std::vector<std::string>& shared_parameters() const { return shared_; }

  // tokens [B, T] int64 -> logits [B, T, vocab]
  at::Tensor forward(const at::Tensor& tokens);

  int64_t vocab_size() const { return vocab_size_; }
  int64_t seq_len() const { return seq_len_; }
  // Parameters that weight decay applies to by default: Linear weights only (not norms, biases
  // or embeddings). A tied parameter counts as what it was first registered as.
  std::vector<std::string> decayed_parameter_names() const;

  // Training FLOPs per token, nanoGPT/PaLM style: 6 N + 12 L H Q T, N the parameter count.
  void set_attention_shape(int64_t layers, int64_t heads, int64_t head_dim);
  double training_flops_per_token() const;

 private:
  struct Entry {
    std::string name;
    std::shared_ptr<Block> block;
    BlockExecutor executor;
    std::vector<BlockHook> pre, post;
  };
  std::vector<Entry> blocks_;
  std::vector<std::string> shared_;
  int64_t vocab_size_, seq_len_;
  int64_t layers_ = 0, heads_ = 0, head_dim_ = 0;
};

}  // namespace strata::nn
