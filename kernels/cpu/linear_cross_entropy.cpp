// For rows i with logits z_i = W h_i + b (V of them) and target t_i, over N rows:
//   loss = (1/N) sum_i (lse(z_i) - z_i[t_i])
//   dL/dz_i = (softmax(z_i) - onehot(t_i)) / N =: G_i
//   dL/dh_i = G_i W,   dL/dW = sum_i G_i^T h_i,   dL/db = sum_i G_i
// Per chunk of rows: one GEMM for the logits, log_softmax in place of nothing larger than the
// chunk, exp back to probabilities, the targets' -1 (or all three in one kernel: ChunkLoss, the
// CUDA cross-entropy kernel), and two GEMMs accumulating the gradients.
// The incoming gradient of the (scalar) loss multiplies the accumulated gradients in backward.
// GEMM operands are fp32 copies (on a CPU bf16 GEMMs are no faster, and the reference's loss is
// fp32), or, where the caller asks (CUDA) and the inputs are bf16/fp16, the inputs themselves,
// multiplied into fp32 outputs (ATen's mm/addmm with out_dtype: tensor-core GEMMs accumulating
// in fp32, CUDA only); G is rounded to the input dtype for its two GEMMs, as the reference's
// autograd rounds the logits' gradient.
#include "linear_cross_entropy.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

namespace strata::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class ChunkedLinearCrossEntropy : public torch::autograd::Function<ChunkedLinearCrossEntropy> {
 public:
  // bias: empty tensor for none. with_grads: whether backward will run (decided by the caller,
  // where grad mode and requires_grad are visible); without it only the loss is computed.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& bias,
                            const at::Tensor& targets, int64_t chunk_rows, bool with_grads, bool input_dtype_gemms,
                            int64_t vocab_multiple, ChunkLoss chunk_loss) {
    const int64_t rows = hidden.size(0), vocab = weight.size(0), dim = weight.size(1);
    // The GEMMs run over `padded` rows of the weight (zeros past `vocab`) so that the logits' rows
    // are aligned for the tensor cores; the padding logits are set to -inf, so they take no
    // probability, their gradient is exactly 0, and nothing else changes.
    const int64_t padded = (vocab + vocab_multiple - 1) / vocab_multiple * vocab_multiple;
    const bool has_bias = bias.numel() > 0;
    // fp32 arithmetic for fp32/bf16/fp16 inputs, as the reference's fp32 loss; fp64 stays fp64.
    const at::ScalarType compute = hidden.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    const bool low_precision = hidden.scalar_type() == at::kBFloat16 || hidden.scalar_type() == at::kHalf;
    // A weight of another dtype (fp32 master weights under autocast) is cast to hidden's, as autocast's linear would.
    const bool gemm_in_input_dtype = input_dtype_gemms && low_precision;
    const at::ScalarType operand = gemm_in_input_dtype ? hidden.scalar_type() : compute;
    at::Tensor w = weight.to(operand).contiguous();
    at::Tensor b = has_bias ? bias.to(compute) : at::Tensor();
    if (padded != vocab) {
      w = at::cat({w, at::zeros({padded - vocab, dim}, w.options())});
      if (has_bias) b = at::cat({b, at::zeros({padded - vocab}, b.options())});
    }
    const auto options = hidden.options().dtype(compute);
    at::Tensor grad_hidden, grad_weight, grad_bias;
    if (with_grads) {
      grad_hidden = at::empty({rows, dim}, options);
      grad_weight = at::zeros({padded, dim}, options);
      if (has_bias) grad_bias = at::zeros({padded}, options);
    }
    const double inv_rows = rows > 0 ? 1.0 / static_cast<double>(rows) : 0.0;
    const int64_t chunk = std::max<int64_t>(1, std::min(chunk_rows, rows));
    // Two chunk-sized buffers reused by every chunk: logits, and the gradient of the logits (in
    // ATen's path log-probabilities turned into it, then cast to the GEMMs' dtype; a chunk_loss
    // kernel writes it in that dtype).
    const bool fused = chunk_loss != nullptr && compute == at::kFloat;
    // With a chunk_loss kernel, 16-bit GEMMs write 16-bit logits (as the reference's autocast
    // linear does), which the kernel reads in fp32: half the bytes through memory.
    const bool low_precision_logits = fused && gemm_in_input_dtype;
    const at::Tensor b_operand = low_precision_logits && has_bias ? b.to(operand) : at::Tensor();
    at::Tensor logits_buffer = at::empty({chunk, padded}, options.dtype(low_precision_logits ? operand : compute));
    at::Tensor probs_buffer = fused ? (with_grads ? at::empty({chunk, padded}, options.dtype(operand)) : at::Tensor())
                                    : at::empty({chunk, padded}, options);
    at::Tensor loss_sum = at::zeros({}, options.dtype(at::kDouble));
    for (int64_t start = 0; start < rows; start += chunk) {
      const int64_t n = std::min(chunk, rows - start);
      const at::Tensor h = hidden.narrow(0, start, n).to(operand);
      const at::Tensor t = targets.narrow(0, start, n).unsqueeze(1);
      at::Tensor logits = logits_buffer.narrow(0, 0, n);
      if (low_precision_logits) {
        if (has_bias) at::addmm_out(logits, b_operand, h, w.t());
        else at::mm_out(logits, h, w.t());
      } else if (gemm_in_input_dtype) {
        at::mm_out(logits, h, w.t(), compute);
        if (has_bias) logits.add_(b);
      } else if (has_bias) {
        at::addmm_out(logits, b, h, w.t());
      } else {
        at::mm_out(logits, h, w.t());
      }
      // G = softmax - onehot (scaled by 1/N in the GEMMs), in the GEMMs' dtype.
      at::Tensor g;
      if (fused) {
        if (with_grads) g = probs_buffer.narrow(0, 0, n);
        chunk_loss(logits, vocab, targets.narrow(0, start, n), loss_sum, g);
        if (!with_grads) continue;
        if (has_bias) grad_bias.add_(g.sum(0, false, compute), inv_rows);
      } else {
        at::Tensor log_probs = probs_buffer.narrow(0, 0, n);
        if (padded != vocab) logits.narrow(1, vocab, padded - vocab).fill_(-std::numeric_limits<double>::infinity());
        at::_log_softmax_out(log_probs, logits, 1, false);
        loss_sum.sub_(log_probs.gather(1, t).sum(), 1.0);
        if (!with_grads) continue;
        g = log_probs.exp_();
        g.scatter_add_(1, t, at::full({n, 1}, -1.0, options));
        if (has_bias) grad_bias.add_(g.sum(0), inv_rows);
        if (gemm_in_input_dtype) g = g.to(operand);
      }
      at::Tensor gh = grad_hidden.narrow(0, start, n);
      if (gemm_in_input_dtype) {
        at::mm_out(gh, g, w, compute).mul_(inv_rows);
        at::addmm_out(grad_weight, grad_weight, g.t(), h, compute, /*beta=*/1.0, /*alpha=*/inv_rows);
      } else {
        at::addmm_out(gh, gh, g, w, /*beta=*/0.0, /*alpha=*/inv_rows);
        grad_weight.addmm_(g.t(), h, 1.0, inv_rows);
      }
    }
    if (with_grads) {
      if (padded != vocab) {
        grad_weight = grad_weight.narrow(0, 0, vocab);
        if (has_bias) grad_bias = grad_bias.narrow(0, 0, vocab);
      }
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
      throw std::logic_error("linear_cross_entropy (chunked): backward of a call made without gradients");
    const auto saved = ctx->get_saved_variables();
    const at::Tensor scale = grad_outputs[0].to(saved[0].scalar_type());
    auto scaled = [&](const at::Tensor& grad, const char* dtype) {
      return grad.defined() ? (grad * scale).to(ctx->saved_data[dtype].toScalarType()) : at::Tensor();
    };
    return {scaled(saved[0], "hidden_dtype"), scaled(saved[1], "weight_dtype"), scaled(saved[2], "bias_dtype"), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

int64_t linear_cross_entropy_chunk_rows(int64_t vocab) {
  return std::max<int64_t>(kLinearCrossEntropyMinRows, kLinearCrossEntropyChunkBytes / (4 * std::max<int64_t>(1, vocab)));
}

at::Tensor linear_cross_entropy_chunked(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                        const at::Tensor& targets, int64_t chunk_rows, bool input_dtype_gemms, int64_t vocab_multiple,
                                        ChunkLoss chunk_loss) {
  if (vocab_multiple < 1) throw std::invalid_argument("linear_cross_entropy: vocab_multiple must be at least 1");
  if (hidden.dim() != 2 || weight.dim() != 2 || targets.dim() != 1 || hidden.size(1) != weight.size(1) ||
      targets.size(0) != hidden.size(0))
    throw std::invalid_argument("linear_cross_entropy: hidden [N, D], weight [V, D] and targets [N] expected");
  const at::Tensor b = bias ? *bias : at::empty({0}, weight.options().requires_grad(false));
  const bool with_grads =
      at::GradMode::is_enabled() && (hidden.requires_grad() || weight.requires_grad() || (bias && bias->requires_grad()));
  return ChunkedLinearCrossEntropy::apply(hidden, weight, b, targets, chunk_rows, with_grads, input_dtype_gemms, vocab_multiple,
                                          chunk_loss);
}

at::Tensor linear_cross_entropy_chunked_cpu(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                            const at::Tensor& targets) {
  return linear_cross_entropy_chunked(hidden, weight, bias, targets, linear_cross_entropy_chunk_rows(weight.size(0)));
}

}  // namespace strata::kernels
