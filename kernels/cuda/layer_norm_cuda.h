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

#include "strata/ops.h"

namespace strata::kernels {

// What the operator implementation "layer_norm.fused_cuda" runs.
at::Tensor layer_norm_fused_cuda(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias, double eps);

// "layer_norm.autocast_out_cuda" (opt-in, not yet run on a GPU): under CUDA autocast to bf16 or
// fp16, the same kernels with the output stored in autocast's dtype, rounded once, and dy read in
// it. A GPT's norms feed only Linears, whose autocast casts their input to that dtype anyway: the
// cast kernel after each norm and the cast of its gradient back to fp32 (about 50 kernels a
// GPT-2 step) disappear, with the same values (the rounding the cast made, made in the kernel;
// dy's values exact in fp32). Outside autocast, or for calls the kernel does not take, as
// layer_norm_fused_cuda. Not the reference's dtype contract (ATen's autocast runs layer_norm in
// fp32 and returns fp32), hence opt-in: for models whose norms feed Linears.
at::Tensor layer_norm_autocast_out_cuda(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias, double eps);

// "add_layer_norm.fused_cuda" (opt-in, not yet run on a GPU): a GPT block's h = x + attn and
// ln_2(h) in the same two kernels: the add in the forward's first read of each row (the sum
// written out, fp32), and backward the residual path's gradient added to dx and the 16-bit
// branch's gradient stored there too: per residual step an add forward, and an add and a cast
// backward, are gone. Bit for bit the add and layer_norm.fused_cuda (or, where that serves the
// norm, layer_norm.autocast_out_cuda's output dtype); it serves only where one of those two
// serves layer_norm in the block, for an fp32 residual with an fp32/bf16/half branch of its shape
// and fp32 weight and bias. Other calls: add_layer_norm.reference.
ops::AddNormResult add_layer_norm_fused_cuda(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight,
                                             const std::optional<at::Tensor>& bias, double eps);

}  // namespace strata::kernels
