// Attention on CUDA served by ATen's fused kernels (flash-attention-2, cuDNN, memory-efficient),
// with every mask ops::AttentionMask describes and a differentiable log-sum-exp, so context
// parallel's ring merges blocks on the GPU without a [Tq, Tk] score matrix. Parity with core's
// attention.reference is tested in tests/gpu/attention_cuda_test.cpp (on a GPU: scripts/gpu_check);
// bench/attention_cuda.cpp measures it there.
#pragma once

#include "strata/ops.h"

namespace strata::kernels {

// What the operator implementation "attention.sdpa_cuda" runs (the choice of ATen kernel is in
// the comment at the top of attention_sdpa.cpp). CUDA tensors of fp32, bf16 or fp16.
ops::AttentionResult attention_sdpa_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                         const ops::AttentionMask& mask, bool with_lse);

// The memory-efficient kernel with a 0/-inf bias and a differentiable lse, always (tests and the
// bench call it directly, to see it where the operator picks another kernel).
ops::AttentionResult attention_efficient_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                              const ops::AttentionMask& mask, bool with_lse);

}  // namespace strata::kernels
