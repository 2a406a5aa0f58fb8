// linear_cross_entropy_cuda.h: the CPU implementation's chunk loop with a GPU's chunk size, its
// GEMMs in the inputs' (or autocast's) dtype (tensor cores for bf16/fp16, fp32 accumulation and outputs).
#include "cuda/linear_cross_entropy_cuda.h"

#include <algorithm>

#include <ATen/autocast_mode.h>

#include "cpu/linear_cross_entropy.h"

namespace strata::kernels {

at::Tensor linear_cross_entropy_chunked_cuda(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                             const at::Tensor& targets) {
  // Under autocast the reference's output projection is a linear, which autocast runs in its
  // dtype (bf16 tensor cores, fp32 accumulation) whatever the dtype of hidden and the fp32 master
  // weight: the chunks' GEMMs do the same (the weight is cast with hidden), the log-softmax stays fp32.
  const bool autocast = at::autocast::is_autocast_enabled(at::kCUDA) && hidden.scalar_type() == at::kFloat;
  const at::Tensor h = autocast ? hidden.to(at::autocast::get_autocast_dtype(at::kCUDA)) : hidden;
  const int64_t rows = std::max<int64_t>(kLinearCrossEntropyCudaMinRows,
                                         kLinearCrossEntropyCudaChunkBytes / (4 * std::max<int64_t>(1, weight.size(0))));
  return linear_cross_entropy_chunked(h, weight, bias, targets, rows, /*input_dtype_gemms=*/true, kLinearCrossEntropyCudaVocabMultiple);
}

}  // namespace strata::kernels
