// linear_cross_entropy_cuda.h: the CPU implementation's chunk loop with a GPU's chunk size, its
// GEMMs in the inputs' (or autocast's) dtype (tensor cores for bf16/fp16, fp32 accumulation and
// outputs), and each chunk's loss and gradient in the fused cross-entropy kernel.
#include "cuda/linear_cross_entropy_cuda.h"

#include <algorithm>

#include <ATen/autocast_mode.h>

#include "cpu/linear_cross_entropy.h"
#ifdef STRATA_HAVE_CUDA_KERNELS
#include "cuda/cross_entropy_cuda.h"
#endif

namespace strata::kernels {

at::Tensor linear_cross_entropy_chunked_cuda(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                             const at::Tensor& targets) {
  return linear_cross_entropy_chunked_cuda_rows(hidden, weight, bias, targets, 0);
}

at::Tensor linear_cross_entropy_chunked_cuda_rows(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                                  const at::Tensor& targets, int64_t chunk_rows) {
  // Under autocast the reference's output projection is a linear, which autocast runs in its
  // dtype (bf16 tensor cores, fp32 accumulation) whatever the dtype of hidden and the fp32 master
  // weight: the chunks' GEMMs do the same (the weight is cast with hidden), the log-softmax stays fp32.
  const bool autocast = at::autocast::is_autocast_enabled(at::kCUDA) && hidden.scalar_type() == at::kFloat;
  const at::Tensor h = autocast ? hidden.to(at::autocast::get_autocast_dtype(at::kCUDA)) : hidden;
  const int64_t rows = chunk_rows > 0 ? chunk_rows
                                      : std::max<int64_t>(kLinearCrossEntropyCudaMinRows,
                                                          kLinearCrossEntropyCudaChunkBytes / (4 * std::max<int64_t>(1, weight.size(0))));
  // The chunk's loss and gradient in one kernel where Strata's CUDA kernels are built (ATen's
  // log_softmax, exp, scatter and cast otherwise).
#ifdef STRATA_HAVE_CUDA_KERNELS
  const ChunkLoss chunk_loss = targets.is_cuda() ? &cross_entropy_chunk_loss_cuda : nullptr;
#else
  const ChunkLoss chunk_loss = nullptr;
#endif
  return linear_cross_entropy_chunked(h, weight, bias, targets, rows, /*input_dtype_gemms=*/true, kLinearCrossEntropyCudaVocabMultiple,
                                      chunk_loss);
}

}  // namespace strata::kernels
