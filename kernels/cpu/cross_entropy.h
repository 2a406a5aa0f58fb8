// Fused cross entropy on the CPU: the `cross_entropy` operator (the loss of every Strata model)
// with the gradient of the logits written in the forward, one pass over each row, where the
// reference (at::cross_entropy_loss) writes log-probabilities in the forward and, in the backward,
// zero-fills an [N, V] tensor for nll_loss's gradient and reads both again for log_softmax's.
// logits float, bfloat16 or half (float arithmetic, the gradient rounded to the logits' dtype as
// the reference's cast rounds it); targets int64, -100 ignored as the reference ignores it; other
// calls go to the reference. Parity: tests/unit/cross_entropy_kernel_test.cpp; time:
// bench/fused_step_time.py (the loss of every size).
#pragma once

#include <ATen/core/Tensor.h>

namespace strata::kernels {

// What the operator implementation "cross_entropy.fused_cpu" runs: mean over the rows whose
// target is not -100 of lse(logits_i) - logits_i[target_i], fp32, 0-dim.
at::Tensor cross_entropy_fused_cpu(const at::Tensor& logits, const at::Tensor& targets);

// Core's cross_entropy.reference, where the fused kernels (CPU and CUDA) send calls they do not take.
at::Tensor cross_entropy_reference_call(const at::Tensor& logits, const at::Tensor& targets);

}  // namespace strata::kernels
