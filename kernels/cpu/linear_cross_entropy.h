// Chunked linear + cross-entropy: the mean cross entropy of hidden w^T + b over rows, computed a
// chunk of rows at a time so that the [N, V] logits never exist. The gradients are computed in
// the forward, chunk by chunk, while each chunk's logits are in cache, and scaled by the
// incoming gradient in the backward (the loss is a scalar, so that is exact). Parity with core's
// linear_cross_entropy.reference: tests/unit/linear_cross_entropy_test.cpp; memory and time:
// bench/linear_cross_entropy.cpp.
#pragma once

#include <cstdint>
#include <optional>

#include <ATen/core/Tensor.h>

namespace strata::kernels {

// Rows per chunk: as many as 4 MiB of fp32 logits hold, and at least 256. The floor is measured
// (bench/results/linear_cross_entropy_cpu.md, vocabulary 50257, 4096 tokens, 2 threads): the
// gradient GEMMs' inner dimension is the chunk's rows, and with 20 rows they ran at a third of
// the rate, the whole step 1.6x slower than the unfused one; at 256 rows it is 1.4x faster than
// unfused, holding two chunks of 49 MiB instead of 2.3 GiB of logits.
inline constexpr int64_t kLinearCrossEntropyChunkBytes = int64_t{4} << 20;
inline constexpr int64_t kLinearCrossEntropyMinRows = 256;

// Rows per chunk for a vocabulary of `vocab`.
int64_t linear_cross_entropy_chunk_rows(int64_t vocab);

// What the operator implementation "linear_cross_entropy.chunked_cpu" runs.
at::Tensor linear_cross_entropy_chunked_cpu(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                            const at::Tensor& targets);

// The same with an explicit chunk size (tests cross chunk edges with few rows). input_dtype_gemms:
// bf16/fp16 inputs multiplied as they are into fp32 outputs (CUDA only: ATen's mm with out_dtype);
// otherwise every GEMM runs on fp32 copies. vocab_multiple: the GEMMs run over the vocabulary
// rounded up to a multiple of it (zero rows of the weight, -inf logits), which keeps the logits'
// rows aligned for tensor cores (GPT-2's 50257 is odd); the results are the same.
// chunk_loss: a fused kernel for the loss of a chunk of logits and their gradient (below); null:
// ATen's log_softmax, exp and scatter, then a cast to the GEMMs' dtype.
using ChunkLoss = void (*)(const at::Tensor& logits, int64_t vocab, const at::Tensor& targets, const at::Tensor& loss_sum,
                           const at::Tensor& grad);
at::Tensor linear_cross_entropy_chunked(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                        const at::Tensor& targets, int64_t chunk_rows, bool input_dtype_gemms = false,
                                        int64_t vocab_multiple = 1, ChunkLoss chunk_loss = nullptr);
// A ChunkLoss, for a chunk's logits [n, W] (contiguous; fp32, or the GEMMs' 16-bit dtype when
// they run in it; columns from `vocab` on are padding) and targets [n]: adds sum_i (lse(z_i) - z_i[t_i]) to loss_sum (a double scalar) and,
// when grad is defined ([n, W], contiguous, the GEMMs' dtype), writes G_i = softmax(z_i) -
// onehot(t_i) there, rounded once, and 0 in the padding.

}  // namespace strata::kernels
