// For rows i with logits z_i (V of them) and targets t_i, over the C rows whose target is not
// the ignore index (-100, at::cross_entropy_loss's default, which the reference uses):
//   loss = (1/C) sum_i (lse(z_i) - z_i[t_i]),   lse(z) = m + log sum_j exp(z_j - m), m = max_j z_j
//   G_i = dloss/dz_i = (exp(z_i - lse(z_i)) - onehot(t_i)) / C      (0 on ignored rows)
// G does not depend on the loss's incoming gradient g except by a factor, so the forward writes
// it while the row is in cache and the backward returns g G (G itself when g = 1, the usual
// case): per row one read of z and one write of G, nothing else [N, V] is made, and z need not
// be kept for the backward. G is kept in float whatever the logits' type: for bfloat16/half
// logits the backward rounds g G once, as the reference rounds its gradient. Rounding G first
// and scaling after loses G's small entries under fp16 loss scaling (g = 65536: entries below
// half's smallest subnormal, 6e-8, flush to zero before they are scaled up); the loss curve of
// amp.fp16_close_to_fp32 drifted by 2e-2 that way. Per row: z copied into G's row as float (a
// float scratch row when no gradient is wanted), then the row arithmetic attention's tiles use
// (attention_rows.h: online_softmax gives exp(z - m) in place and its sum, scale_rows multiplies
// by 1 / (C sum)), then -1/C at the target. Rows are split over ATen's threads; the loss is summed in double from
// per-row values in row order, so it does not depend on the thread count. Without gradients
// (evaluation) the rows go through the scratch row only.
#include "cross_entropy.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include "attention_rows.h"
#include "strata/ops.h"
#include "strata/ops.h"

namespace strata::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kIgnoreIndex = -100;

// The number of rows that count; throws for a target outside [0, V) that is not ignored.
int64_t counted_rows(const at::Tensor& targets, int64_t vocab) {
  const int64_t* t = targets.data_ptr<int64_t>();
  int64_t count = 0;
  for (int64_t i = 0; i < targets.numel(); ++i) {
    if (t[i] == kIgnoreIndex) continue;
    if (t[i] < 0 || t[i] >= vocab)
      throw std::invalid_argument("cross_entropy: target " + std::to_string(t[i]) + " of row " + std::to_string(i) +
                                  " is outside [0, " + std::to_string(vocab) + ")");
    ++count;
  }
  return count;
}

// Rows [begin, end): row_loss[i] = lse(z_i) - z_i[t_i] (0 if ignored) and, if grad is given,
// G_i = (softmax(z_i) - onehot(t_i)) * inv_count.
template <class T>
void loss_and_gradient_rows(const T* z, const int64_t* targets, int64_t vocab, int64_t begin, int64_t end, float inv_count,
                            float* grad, double* row_loss) {
  const AttentionRowOps<float>& ops = attention_row_ops_float();
  std::vector<float> scratch;
  for (int64_t i = begin; i < end; ++i) {
    const T* zi = z + i * vocab;
    const int64_t t = targets[i];
    if (t == kIgnoreIndex) {
      row_loss[i] = 0;
      if (grad) std::memset(grad + i * vocab, 0, sizeof(float) * vocab);
      continue;
    }
    float* row = grad ? grad + i * vocab : nullptr;
    if (!row) {
      scratch.resize(vocab);
      row = scratch.data();
    }
    if constexpr (std::is_same_v<T, float>) {
      std::memcpy(row, zi, sizeof(float) * vocab);
    } else {
      for (int64_t j = 0; j < vocab; ++j) row[j] = static_cast<float>(zi[j]);
    }
    const float target_logit = static_cast<float>(zi[t]);
    float m = -std::numeric_limits<float>::infinity(), sum = 0, alpha = 0;
    ops.online_softmax(row, 1, vocab, vocab, &m, &sum, &alpha);  // row = exp(z - m), sum = its sum
    row_loss[i] = static_cast<double>(m) + std::log(static_cast<double>(sum)) - static_cast<double>(target_logit);
    if (!grad) continue;
    const float factor = inv_count / sum;
    ops.scale_rows(row, 1, vocab, vocab, &factor);
    row[t] -= inv_count;
  }
}

class FusedCrossEntropy : public torch::autograd::Function<FusedCrossEntropy> {
 public:
  // with_grads: whether backward will run (decided by the caller, where grad mode is visible).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& targets, bool with_grads) {
    const at::Tensor z = logits.contiguous(), t = targets.contiguous();
    const int64_t rows = z.size(0), vocab = z.size(1);
    const int64_t count = counted_rows(t, vocab);
    // No counted row: the reference's 0/0 loss and zero gradient.
    const float inv_count = count > 0 ? 1.0f / static_cast<float>(count) : 0.0f;
    at::Tensor grad = with_grads ? at::empty(z.sizes(), z.options().dtype(at::kFloat)) : at::Tensor();
    std::vector<double> row_loss(rows);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, z.scalar_type(), "cross_entropy_fused_cpu", [&] {
      if constexpr (std::is_same_v<scalar_t, double>) {
        throw std::logic_error("cross_entropy.fused_cpu: double goes to the reference");
      } else {
        const scalar_t* zp = z.data_ptr<scalar_t>();
        float* gp = with_grads ? grad.data_ptr<float>() : nullptr;
        at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
          loss_and_gradient_rows<scalar_t>(zp, t.data_ptr<int64_t>(), vocab, begin, end, inv_count, gp, row_loss.data());
        });
      }
    });
    double total = 0;
    for (const double l : row_loss) total += l;
    if (with_grads) ctx->save_for_backward({grad});
    ctx->saved_data["with_grads"] = with_grads;
    ctx->saved_data["logits_dtype"] = z.scalar_type();
    return at::scalar_tensor(total / static_cast<double>(count), z.options().dtype(at::kFloat));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    if (!ctx->saved_data["with_grads"].toBool())
      throw std::logic_error("cross_entropy (fused): backward of a call made without gradients");
    const at::Tensor grad = ctx->get_saved_variables()[0];
    const at::Tensor& g = grad_outputs[0];
    const auto dtype = ctx->saved_data["logits_dtype"].toScalarType();
    // g = 1 (a plain fp32 loss.backward()) is the common case: G as it is, no pass over [N, V].
    // Otherwise g G in float, rounded once to the logits' type.
    const bool unit = g.item<double>() == 1.0;  // g is defined: the Function materialises gradients
    const at::Tensor scaled = unit ? grad : grad * g.to(at::kFloat);
    return {scaled.to(dtype), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor cross_entropy_reference_call(const at::Tensor& logits, const at::Tensor& targets) {
  const auto& reference =
      static_cast<const ops::OperatorImpl<ops::CrossEntropy>&>(*ops::implementations("cross_entropy").back());
  return reference.fn()(logits, targets);
}

at::Tensor cross_entropy_fused_cpu(const at::Tensor& logits, const at::Tensor& targets) {
  const bool ours = logits.device().is_cpu() && logits.dim() == 2 && targets.dim() == 1 && targets.size(0) == logits.size(0) &&
                    targets.scalar_type() == at::kLong && logits.size(1) > 0 &&
                    (logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kBFloat16 ||
                     logits.scalar_type() == at::kHalf);
  if (!ours) return cross_entropy_reference_call(logits, targets);
  const bool with_grads = at::GradMode::is_enabled() && logits.requires_grad();
  return FusedCrossEntropy::apply(logits, targets, with_grads);
}

}  // namespace strata::kernels
