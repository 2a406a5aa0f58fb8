// Fused cross entropy on a GPU: the `cross_entropy` operator in one kernel forward
// (cuda/cross_entropy_kernels.cu) that writes the loss's per-row terms and the logits' float
// gradient; the backward is one elementwise product, g / C times that gradient, rounded once to
// the logits' dtype (as cross_entropy.fused_cpu; the count C stays on the device, nothing is
// read back to the host). Logits float, bfloat16 or half [N, V], int64 targets [N], -100
// ignored; other calls go to the reference. Peak memory: N x V floats for the gradient where
// ATen keeps N x V log-probabilities of the logits' dtype and makes a zero-filled N x V and the
// gradient in the backward. Parity: tests/gpu/cross_entropy_cuda_test.cpp (scripts/gpu_check).
// Built where nvcc is (STRATA_HAVE_CUDA_KERNELS, kernels/CMakeLists.txt).
#pragma once

#include <ATen/core/Tensor.h>

namespace strata::kernels {

// What the operator implementation "cross_entropy.fused_cuda" runs: mean over the rows whose
// target is not -100 of lse(logits_i) - logits_i[target_i], fp32, 0-dim.
at::Tensor cross_entropy_fused_cuda(const at::Tensor& logits, const at::Tensor& targets);

// The same kernel as the chunked linear + cross-entropy's ChunkLoss (cpu/linear_cross_entropy.h):
// one chunk's logits (padded rows), its row losses summed into loss_sum, and G written in
// grad's dtype (bf16/half for the chunk's GEMMs, or float), 0 in the padding; on the current stream.
void cross_entropy_chunk_loss_cuda(const at::Tensor& logits, int64_t vocab, const at::Tensor& targets, const at::Tensor& loss_sum,
                                   const at::Tensor& grad);

}  // namespace strata::kernels
