// Fused RMSNorm on a GPU: the `rms_norm` operator (Llama's norm) in one kernel forward and one
// backward (cuda/rms_norm_kernels.cu; the autograd shared with the CPU kernel,
// cpu/rms_norm_autograd.h), saving one float per row where the reference saves fp32 copies of
// the activation. x float, bfloat16 or half with a weight of x's dtype or fp32; any
// other weight dtype is served by the reference. Parity with core's reference:
// tests/gpu/rms_norm_cuda_test.cpp; time and memory: bench/rms_norm_cuda.cpp (scripts/gpu_check).
// Built where nvcc is (STRATA_HAVE_CUDA_KERNELS, kernels/CMakeLists.txt).
#pragma once

#include <ATen/core/Tensor.h>

#include "strata/ops.h"

namespace strata::kernels {

// What the operator implementation "rms_norm.fused_cuda" runs.
at::Tensor rms_norm_fused_cuda(const at::Tensor& x, const at::Tensor& weight, double eps);

// "rms_norm.autocast_out_cuda" (opt-in, not yet run on a GPU): under CUDA autocast to bf16 or
// fp16 with fp32 x and weight (a Llama's residual stream and norms under amp), the same kernels
// with the output stored in autocast's dtype, rounded once, and dy read in it: the cast after the
// norm and the one before its backward go, with the same values (layer_norm.autocast_out_cuda's
// reasoning, kernels/README.md). Otherwise as rms_norm_fused_cuda.
at::Tensor rms_norm_autocast_out_cuda(const at::Tensor& x, const at::Tensor& weight, double eps);

// "add_rms_norm.fused_cuda" (opt-in, not yet run on a GPU): a Llama block's h = x + attention and
// post_attention_layernorm(h) in the same two kernels, as add_rms_norm.fused_cpu does on the CPU
// (the add in the forward's first read of each row, the residual path's gradient added to dx and
// the 16-bit branch's gradient stored in the backward). Bit for bit the add and
// rms_norm.fused_cuda (or rms_norm.autocast_out_cuda's output dtype where that serves the norm);
// serves only where one of those two serves rms_norm in the block. Other calls: the reference.
ops::AddNormResult add_rms_norm_fused_cuda(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace strata::kernels
