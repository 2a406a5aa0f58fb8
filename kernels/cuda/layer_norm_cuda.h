// Fused LayerNorm on a GPU: the `layer_norm` operator (GPT's norm) in one kernel forward and one
// backward (cuda/layer_norm_kernels.cu), for fp32 x, weight and bias: what a GPT's residual stream
// and norms are, under amp too (autocast runs layer_norm in fp32). The backward gives dx, dw and db
// in one pass over x and dy where ATen's runs two kernels. Saves x and two floats per row (mean,
// rstd), as ATen does. Any other call (16-bit x, broadcast weights) goes to the reference. Parity
// with core's reference: tests/gpu/layer_norm_cuda_test.cpp (scripts/gpu_check). Built where nvcc
// is (STRATA_HAVE_CUDA_KERNELS, kernels/CMakeLists.txt).
#pragma once

#include <optional>

#include <ATen/core/Tensor.h>

namespace strata::kernels {

// What the operator implementation "layer_norm.fused_cuda" runs.
at::Tensor layer_norm_fused_cuda(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias, double eps);

}  // namespace strata::kernels
