// Fused RMSNorm on the CPU: the `rms_norm` operator (Llama's norm) in one pass over each row
// forward (sum of squares, then the scaled row) and one backward (dx and this thread's share of
// dw), the autograd shared with the CUDA kernel (rms_norm_autograd.h), where the reference
// composes a dtype copy, a square, a mean, an rsqrt, two products and a cast and saves fp32
// copies of the activation. x float, bfloat16 or half with a weight of x's dtype or fp32, float
// arithmetic and the reference's roundings; other calls go to the reference. Parity:
// tests/unit/rms_norm_kernel_test.cpp; time: bench/results/fused_step_time_cpu.md (Llama).
#pragma once

#include <ATen/core/Tensor.h>

#include "strata/ops.h"

namespace strata::kernels {

// What the operator implementation "rms_norm.fused_cpu" runs.
at::Tensor rms_norm_fused_cpu(const at::Tensor& x, const at::Tensor& weight, double eps);

// What "add_rms_norm.fused_cpu" runs: the pre-norm residual step (ops::AddRmsNorm) with the add in
// the norm's pass over each row and, backward, the residual gradient added in the norm's backward;
// bit for bit the add and rms_norm.fused_cpu. Serves only where rms_norm.fused_cpu serves the
// norm in this block (a norm pinned elsewhere gets the add and its pin), for an fp32 residual
// with an fp32, bf16 or half branch; other calls (16-bit sums too: slower fused on the CPU): the
// reference.
ops::AddNormResult add_rms_norm_fused_cpu(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace strata::kernels
