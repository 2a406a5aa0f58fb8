// linear_cross_entropy_cuda.h: the CPU implementation's chunk loop with a GPU's chunk size, its
// GEMMs in the inputs' dtype (tensor cores for bf16/fp16, fp32 accumulation and outputs).
#include "cuda/linear_cross_entropy_cuda.h"

#include <algorithm>

#include "cpu/linear_cross_entropy.h"

namespace strata::kernels {

at::Tensor linear_cross_entropy_chunked_cuda(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                             const at::Tensor& targets) {
  const int64_t rows = std::max<int64_t>(kLinearCrossEntropyCudaMinRows,
                                         kLinearCrossEntropyCudaChunkBytes / (4 * std::max<int64_t>(1, weight.size(0))));
  return linear_cross_entropy_chunked(hidden, weight, bias, targets, rows, /*input_dtype_gemms=*/true);
}

}  // namespace strata::kernels
