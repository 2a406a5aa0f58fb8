// Vocab-parallel linear + cross entropy, a chunk of rows at a time. Each of the t ranks of the
// tensor group holds V/t rows of the output projection's weight, so for every token it can
// compute only its V/t logits. Per chunk of rows (as many as 4 MiB of this rank's fp32 logits
// hold, at least 256), with z = h W_r^T + b_r this rank's logits:
//   m      = max over the group of max_j z_ij         (one all-reduce, MAX, of n floats)
//   s, zt  = sum over the group of sum_j exp(z_ij - m_i), and of the target's logit on the rank
//            that holds it, 0 elsewhere                (one all-reduce, SUM, of 2n floats)
//   loss  += sum_i log(s_i) + m_i - zt_i
//   G      = exp(z - m - log s) - onehot(t in this rank's columns)      (then / N)
//   dh    += G W_r (this rank's part: the head's input hook, copy_to_group or sequence
//            parallel's gather, sums the parts in backward), dW_r += G^T h, db_r += sum G.
// The [N, V] logits never exist anywhere, and no rank holds more than one chunk of its V/t.
// Arithmetic is fp32 on fp32 copies of the operands (the reference's loss is fp32), as the
// chunked CPU kernel does; the all-reduces are the group's own collectives (not counted in the
// tensor_parallel pass's tp_*_bytes metrics, which count strata::dist's).
#include "vocab_parallel_loss.h"

#include <algorithm>
#include <stdexcept>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

namespace strata::fused_loss {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kChunkBytes = int64_t{4} << 20;
constexpr int64_t kMinRows = 256;

class VocabParallelLinearCrossEntropy : public torch::autograd::Function<VocabParallelLinearCrossEntropy> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& bias,
                            const at::Tensor& targets, int64_t vocab_start, int64_t group_handle, bool with_grads) {
    Communicator& group = *reinterpret_cast<Communicator*>(group_handle);
    const int64_t rows = hidden.size(0), columns = weight.size(0), dim = weight.size(1);
    const bool has_bias = bias.numel() > 0;
    const auto options = hidden.options().dtype(at::kFloat);
    const at::Tensor w = weight.to(at::kFloat).contiguous();
    const at::Tensor b = has_bias ? bias.to(at::kFloat) : at::Tensor();
    at::Tensor grad_hidden, grad_weight, grad_bias;
    if (with_grads) {
      grad_hidden = at::empty({rows, dim}, options);
      grad_weight = at::zeros({columns, dim}, options);
      if (has_bias) grad_bias = at::zeros({columns}, options);
    }
    const double inv_rows = rows > 0 ? 1.0 / static_cast<double>(rows) : 0.0;
    const int64_t chunk = std::max<int64_t>(1, std::min(rows, std::max(kMinRows, kChunkBytes / (4 * std::max<int64_t>(1, columns)))));
    at::Tensor logits_buffer = at::empty({chunk, columns}, options);
    at::Tensor loss_sum = at::zeros({}, options.dtype(at::kDouble));
    for (int64_t start = 0; start < rows; start += chunk) {
      const int64_t n = std::min(chunk, rows - start);
      const at::Tensor h = hidden.narrow(0, start, n).to(at::kFloat);
      at::Tensor z = logits_buffer.narrow(0, 0, n);
      if (has_bias) at::addmm_out(z, b, h, w.t());
      else at::mm_out(z, h, w.t());
      // Every rank computes the same m, s and zt for the chunk's rows.
      at::Tensor max = std::get<0>(z.max(1)).contiguous();
      group.all_reduce(max, ReduceOp::Max)->wait();
      const at::Tensor local = targets.narrow(0, start, n) - vocab_start;
      const at::Tensor mine = local.ge(0).logical_and_(local.lt(columns));
      const at::Tensor column = local.clamp(0, columns - 1).unsqueeze(1);
      const at::Tensor target_logit_here = z.gather(1, column).squeeze(1).masked_fill(mine.logical_not(), 0.0);
      z.sub_(max.unsqueeze(1)).exp_();  // z now holds exp(z - m)
      at::Tensor sums = at::stack({z.sum(1), target_logit_here});
      group.all_reduce(sums, ReduceOp::Sum)->wait();
      const at::Tensor sum = sums[0], target_logit = sums[1];
      loss_sum.add_((sum.log() + max - target_logit).sum());
      if (!with_grads) continue;
      at::Tensor g = z.div_(sum.unsqueeze(1));  // softmax over the whole vocabulary, this rank's columns
      g.scatter_add_(1, column, mine.to(at::kFloat).neg().unsqueeze(1));
      if (has_bias) grad_bias.add_(g.sum(0), inv_rows);
      at::Tensor gh = grad_hidden.narrow(0, start, n);
      at::addmm_out(gh, gh, g, w, /*beta=*/0.0, /*alpha=*/inv_rows);
      grad_weight.addmm_(g.t(), h, 1.0, inv_rows);
    }
    if (with_grads) {
      ctx->save_for_backward({grad_hidden, grad_weight, grad_bias});
      ctx->saved_data["hidden_dtype"] = hidden.scalar_type();
      ctx->saved_data["weight_dtype"] = weight.scalar_type();
      ctx->saved_data["bias_dtype"] = bias.scalar_type();
    }
    ctx->saved_data["with_grads"] = with_grads;
    return loss_sum.mul_(inv_rows).to(at::kFloat);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    if (!ctx->saved_data["with_grads"].toBool())
      throw std::logic_error("vocab-parallel linear_cross_entropy: backward of a call made without gradients");
    const auto saved = ctx->get_saved_variables();
    const at::Tensor scale = grad_outputs[0].to(at::kFloat);
    auto scaled = [&](const at::Tensor& grad, const char* dtype) {
      return grad.defined() ? (grad * scale).to(ctx->saved_data[dtype].toScalarType()) : at::Tensor();
    };
    return {scaled(saved[0], "hidden_dtype"), scaled(saved[1], "weight_dtype"), scaled(saved[2], "bias_dtype"), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor vocab_parallel_linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                               const at::Tensor& targets, int64_t vocab_start, Communicator& group) {
  if (hidden.dim() != 2 || weight.dim() != 2 || targets.dim() != 1 || hidden.size(1) != weight.size(1) ||
      targets.size(0) != hidden.size(0))
    throw std::invalid_argument("vocab-parallel linear_cross_entropy: hidden [N, D], weight [V/t, D] and targets [N] expected");
  const at::Tensor b = bias ? *bias : at::empty({0}, weight.options().requires_grad(false));
  const bool with_grads =
      at::GradMode::is_enabled() && (hidden.requires_grad() || weight.requires_grad() || (bias && bias->requires_grad()));
  return VocabParallelLinearCrossEntropy::apply(hidden, weight, b, targets, vocab_start, reinterpret_cast<int64_t>(&group), with_grads);
}

}  // namespace strata::fused_loss
