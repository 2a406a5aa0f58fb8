// Fused CPU attention: blocked, online-softmax attention (the flash-attention-2 scheme) that never
// holds a [Tq, Tk] score matrix or mask, with every mask ops::AttentionMask describes, grouped-
// query heads and a differentiable log-sum-exp. Parity with core's attention.reference is tested
// in tests/unit/attention_kernel_test.cpp; bench/attention.py measures it.
#pragma once

#include <cstdint>

#include "strata/ops.h"

namespace strata::kernels {

// Block sizes chosen by measurement (kernels/README.md): queries per tile, keys per tile.
inline constexpr int64_t kAttentionBlockQ = 64;
inline constexpr int64_t kAttentionBlockK = 128;

// What the operator implementation "attention.fused_cpu" runs: the blocked kernel for fp32/fp64,
// ATen's fused SDPA for plain bfloat16/half calls where ATen's oneDNN multiplies in that type
// (see the comment in attention.cpp).
ops::AttentionResult attention_fused_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                         const ops::AttentionMask& mask, bool with_lse);

// The blocked kernel itself, always (tests and the bench call it directly; small blocks let a
// test cross many block edges with few tokens). Differentiable in q, k, v and the additive mask.
ops::AttentionResult attention_blocked_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                           const ops::AttentionMask& mask, bool with_lse,
                                           int64_t block_q = kAttentionBlockQ, int64_t block_k = kAttentionBlockK);

// What "attention_backward.fused_cpu" runs: the blocked kernel's backward pass on a given output
// and lse (ops::AttentionBackward), any dtype computed in fp32 (fp64 for fp64) ...
ops::AttentionGradients attention_backward_fused_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                     const at::Tensor& out, const at::Tensor& lse, const at::Tensor& d_out,
                                                     const ops::AttentionMask& mask);
// ... with the block sizes given (tests).
ops::AttentionGradients attention_backward_blocked_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                       const at::Tensor& out, const at::Tensor& lse, const at::Tensor& d_out,
                                                       const ops::AttentionMask& mask, int64_t block_q = kAttentionBlockQ,
                                                       int64_t block_k = kAttentionBlockK);

}  // namespace strata::kernels
