// The chunked linear + cross-entropy (kernels/cpu/linear_cross_entropy.cpp: ATen calls only, so
// the same code runs on CUDA) with chunks sized for a GPU: the [N, V] logits never exist, two
// chunk-sized buffers do. Parity: tests/gpu/linear_cross_entropy_cuda_test.cpp; memory and time:
// bench/linear_cross_entropy_cuda.cpp (on a GPU: scripts/gpu_check).
#pragma once

#include <cstdint>
#include <optional>

#include <ATen/core/Tensor.h>

namespace strata::kernels {

// Rows per chunk on a GPU: as many as 256 MiB of fp32 logits hold, at least 1024 (GEMMs with
// fewer rows leave an H100/H200 idle; 1335 rows at vocabulary 50257).
inline constexpr int64_t kLinearCrossEntropyCudaChunkBytes = int64_t{256} << 20;
inline constexpr int64_t kLinearCrossEntropyCudaMinRows = 1024;
// The GEMMs' vocabulary rounded up to a multiple of 64 (nanoGPT's 50304 for GPT-2): cuBLAS's
// tensor-core kernels want the logits' rows 16-byte aligned, which 50257 bf16 values are not.
inline constexpr int64_t kLinearCrossEntropyCudaVocabMultiple = 64;

// What "linear_cross_entropy.chunked_cuda" runs: per chunk one GEMM for the logits, the loss and
// the gradient of the logits in one kernel (cuda/cross_entropy_kernels.h, written in the GEMMs'
// dtype), two GEMMs for the gradients.
at::Tensor linear_cross_entropy_chunked_cuda(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                             const at::Tensor& targets);
// The same with `chunk_rows` rows per chunk (tests cross chunk edges with few rows).
at::Tensor linear_cross_entropy_chunked_cuda_rows(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                                  const at::Tensor& targets, int64_t chunk_rows);

}  // namespace strata::kernels
