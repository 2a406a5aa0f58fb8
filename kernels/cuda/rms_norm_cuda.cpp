// The autograd and launches of the fused RMSNorm (rms_norm_cuda.h) on the current stream.
#include "cuda/rms_norm_cuda.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/custom_function.h>

#include "cuda/rms_norm_kernels.h"
#include "strata/core/operator_table.h"

namespace strata::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::optional<cuda::Storage> storage_of(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return cuda::Storage::Float;
    case at::kBFloat16: return cuda::Storage::BFloat16;
    case at::kHalf: return cuda::Storage::Half;
    default: return std::nullopt;
  }
}

void check_launch(int error, const char* what) { TORCH_CHECK(error == 0, "rms_norm: CUDA kernel launch failed in ", what, " (cudaError ", error, ")"); }

void* current_stream() { return static_cast<void*>(c10::cuda::getCurrentCUDAStream().stream()); }

class RmsNormCuda : public torch::autograd::Function<RmsNormCuda> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight, double eps) {
    const c10::cuda::CUDAGuard guard(input.device());
    const at::Tensor x = input.contiguous(), w = weight.contiguous();
    const int64_t dim = x.size(-1), rows = dim > 0 ? x.numel() / dim : 0;
    // The reference's w * n promotes: fp32 with an fp32 weight, else x's dtype.
    at::Tensor y = at::empty(x.sizes(), x.options().dtype(at::promote_types(x.scalar_type(), w.scalar_type())));
    at::Tensor rstd = at::empty({rows}, x.options().dtype(at::kFloat));
    check_launch(cuda::rms_norm_forward(*storage_of(x.scalar_type()), *storage_of(w.scalar_type()), x.const_data_ptr(), w.const_data_ptr(),
                                        y.mutable_data_ptr(), rstd.mutable_data_ptr<float>(), rows, dim, eps, current_stream()),
                 "forward");
    ctx->save_for_backward({x, w, rstd});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &rstd = saved[2];
    const c10::cuda::CUDAGuard guard(x.device());
    const int64_t dim = x.size(-1), rows = dim > 0 ? x.numel() / dim : 0;
    const at::Tensor dy = grads[0].to(at::promote_types(x.scalar_type(), w.scalar_type())).contiguous();
    at::Tensor dx = at::empty_like(x);
    at::Tensor partial = at::zeros({cuda::rms_norm_backward_groups(rows), dim}, x.options().dtype(at::kFloat));
    check_launch(cuda::rms_norm_backward(*storage_of(x.scalar_type()), *storage_of(w.scalar_type()), x.const_data_ptr(), w.const_data_ptr(),
                                         rstd.const_data_ptr<float>(), dy.const_data_ptr(), dx.mutable_data_ptr(),
                                         partial.mutable_data_ptr<float>(), rows, dim, current_stream()),
                 "backward");
    return {dx, partial.sum(0).to(w.scalar_type()), at::Tensor()};
  }
};

}  // namespace

at::Tensor rms_norm_fused_cuda(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const bool weight_fits = weight.dim() == 1 && x.dim() >= 1 && weight.size(0) == x.size(-1) &&
                           (weight.scalar_type() == x.scalar_type() || weight.scalar_type() == at::kFloat);
  if (!x.is_cuda() || !weight.is_cuda() || !storage_of(x.scalar_type()) || !weight_fits) {
    // A call the kernel does not take (a bf16 weight on fp32 x, a broadcast weight): the reference.
    const auto& reference = static_cast<const ops::OperatorImpl<ops::RmsNorm>&>(*OperatorTable::global().implementations("rms_norm").back());
    return reference.fn()(x, weight, eps);
  }
  return RmsNormCuda::apply(x, weight, eps);
}

}  // namespace strata::kernels
