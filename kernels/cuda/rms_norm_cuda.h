// Fused RMSNorm on a GPU: the `rms_norm` operator (Llama's norm) in one kernel forward and one
// backward (cuda/rms_norm_kernels.cu; the autograd shared with the CPU kernel,
// cpu/rms_norm_autograd.h), saving one float per row where the reference saves fp32 copies of
// the activation. x float, bfloat16 or half with a weight of x's dtype or fp32; any
// other weight dtype is served by the reference. Parity with core's reference:
// tests/gpu/rms_norm_cuda_test.cpp; time and memory: bench/rms_norm_cuda.cpp (scripts/gpu_check).
// Built where nvcc is (STRATA_HAVE_CUDA_KERNELS, kernels/CMakeLists.txt).
#pragma once

#include <ATen/core/Tensor.h>

namespace strata::kernels {

// What the operator implementation "rms_norm.fused_cuda" runs.
at::Tensor rms_norm_fused_cuda(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace strata::kernels
