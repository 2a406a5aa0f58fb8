// The CUDA kernels' side of cpu/rms_norm_autograd.h (rms_norm_cuda.h): launches on the tensors'
// device and current stream.
#include "cuda/rms_norm_cuda.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cpu/rms_norm_autograd.h"
#include "cuda/autocast_half.h"
#include "cuda/rms_norm_kernels.h"
#include "cuda/storage_of.h"

namespace strata::kernels {
namespace {

void check_launch(int error, const char* what) { TORCH_CHECK(error == 0, "rms_norm: CUDA kernel launch failed in ", what, " (cudaError ", error, ")"); }

void* current_stream() { return static_cast<void*>(c10::cuda::getCurrentCUDAStream().stream()); }

struct CudaKernels {
  static void forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& y, const at::Tensor& rstd, double eps) {
    add_forward(x, at::Tensor(), w, at::Tensor(), y, rstd, eps);
  }
  // With `branch` undefined, forward; else the norm of sum = residual + branch, written to `sum`.
  static void add_forward(const at::Tensor& residual, const at::Tensor& branch, const at::Tensor& w, const at::Tensor& sum,
                          const at::Tensor& y, const at::Tensor& rstd, double eps) {
    const c10::cuda::CUDAGuard guard(residual.device());
    const int64_t dim = residual.size(-1), rows = dim > 0 ? residual.numel() / dim : 0;
    const auto x_type = storage_of(residual.scalar_type());
    check_launch(cuda::rms_norm_forward(x_type, storage_of(w.scalar_type()), storage_of(y.scalar_type()), residual.const_data_ptr(),
                                        branch.defined() ? branch.const_data_ptr() : nullptr,
                                        branch.defined() ? storage_of(branch.scalar_type()) : x_type,
                                        sum.defined() ? sum.mutable_data_ptr() : nullptr, w.const_data_ptr(), y.mutable_data_ptr(),
                                        rstd.mutable_data_ptr<float>(), rows, dim, eps, current_stream()),
                 "forward");
  }
  static int64_t backward_groups(int64_t rows) { return cuda::rms_norm_backward_groups(rows); }
  static void backward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& rstd, const at::Tensor& dy, const at::Tensor& dx,
                       const at::Tensor& partial, const at::Tensor& dx_plus = {}, const at::Tensor& dx_branch = {}) {
    const c10::cuda::CUDAGuard guard(x.device());
    const int64_t dim = x.size(-1), rows = dim > 0 ? x.numel() / dim : 0;
    const auto x_type = storage_of(x.scalar_type());
    check_launch(cuda::rms_norm_backward(x_type, storage_of(w.scalar_type()), storage_of(dy.scalar_type()), x.const_data_ptr(),
                                         w.const_data_ptr(), rstd.const_data_ptr<float>(), dy.const_data_ptr(), dx.mutable_data_ptr(),
                                         dx_plus.defined() ? dx_plus.const_data_ptr() : nullptr,
                                         dx_branch.defined() ? dx_branch.mutable_data_ptr() : nullptr,
                                         dx_branch.defined() ? storage_of(dx_branch.scalar_type()) : x_type,
                                         partial.mutable_data_ptr<float>(), rows, dim, current_stream()),
                 "backward");
  }
};

}  // namespace

at::Tensor rms_norm_fused_cuda(const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (!rms_norm_fused_takes(x, weight, c10::DeviceType::CUDA)) return rms_norm_reference_call(x, weight, eps);
  return RmsNormFunction<CudaKernels>::apply(x, weight, eps, kPromotedOutput);
}

at::Tensor rms_norm_autocast_out_cuda(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const std::optional<at::ScalarType> out = cuda_autocast_half_type();
  if (!out || x.scalar_type() != at::kFloat || weight.scalar_type() != at::kFloat || !rms_norm_fused_takes(x, weight, c10::DeviceType::CUDA))
    return rms_norm_fused_cuda(x, weight, eps);
  return RmsNormFunction<CudaKernels>::apply(x, weight, eps, static_cast<int64_t>(*out));
}

ops::AddNormResult add_rms_norm_fused_cuda(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight, double eps) {
  // The norm's output dtype follows whichever of the two implementations serves rms_norm here
  // (rms_norm_autocast_out_cuda's rule for when its 16-bit output applies).
  int64_t out = kPromotedOutput;
  if (add_rms_norm_fused_takes(residual, x, weight, c10::DeviceType::CUDA, "rms_norm.autocast_out_cuda")) {
    const std::optional<at::ScalarType> half = cuda_autocast_half_type();
    if (half && residual.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat) out = static_cast<int64_t>(*half);
  } else if (!add_rms_norm_fused_takes(residual, x, weight, c10::DeviceType::CUDA, "rms_norm.fused_cuda")) {
    return add_rms_norm_reference_call(residual, x, weight, eps);
  }
  const auto outputs = AddRmsNormFunction<CudaKernels>::apply(residual, x, weight, eps, out);
  return {outputs[0], outputs[1]};
}

}  // namespace strata::kernels
