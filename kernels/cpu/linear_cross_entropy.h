// Chunked linear + cross-entropy: the mean cross entropy of hidden w^T + b over rows, computed a
// chunk of rows at a time so that the [N, V] logits never exist. The gradients are computed in
// the forward, chunk by chunk, while each chunk's logits are in cache, and scaled by the
// incoming gradient in the backward (the loss is a scalar, so that is exact). Parity with core's
// linear_cross_entropy.reference: tests/unit/linear_cross_entropy_test.cpp; memory and time:
// bench/linear_cross_entropy.py.
#pragma once

#include <cstdint>
#include <optional>

#include <ATen/core/Tensor.h>

namespace strata::kernels {

// A chunk's logits take at most this many bytes (fp32): 4 MiB keeps a chunk of the default GPT's
// head in L2-sized pieces while the GEMMs stay large enough to run at full rate.
inline constexpr int64_t kLinearCrossEntropyChunkBytes = int64_t{4} << 20;

// Rows per chunk for a vocabulary of `vocab`: as many as fit kLinearCrossEntropyChunkBytes, at
// least 16.
int64_t linear_cross_entropy_chunk_rows(int64_t vocab);

// What the operator implementation "linear_cross_entropy.chunked_cpu" runs.
at::Tensor linear_cross_entropy_chunked_cpu(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                            const at::Tensor& targets);

// The same with an explicit chunk size (tests cross chunk edges with few rows).
at::Tensor linear_cross_entropy_chunked(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                        const at::Tensor& targets, int64_t chunk_rows);

}  // namespace strata::kernels
