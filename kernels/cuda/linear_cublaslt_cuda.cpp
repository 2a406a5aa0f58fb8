// linear.cublaslt_cuda (linear_cublaslt_cuda.h): y = x W^T + b as at::linear computes it, and a
// backward of two GEMMs where ATen's has two GEMMs and a reduction: dx = dy W (cuBLAS, as ATen),
// then dW = dy^T x with db = sum over rows of dy in the same cuBLASLt call. Where cuBLASLt offers
// no algorithm for a shape, that call's dW and db are computed as ATen computes them.
#include "cuda/linear_cublaslt_cuda.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/custom_function.h>

#include "cuda/cublaslt_weight_gradient.h"

namespace strata::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool half_type(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

// x, weight and bias share one 16-bit type; autocast is off inside.
class LinearBiasGradientInGemm : public torch::autograd::Function<LinearBiasGradientInGemm> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
    const at::Tensor rows = x.reshape({-1, x.size(-1)}).contiguous();
    ctx->save_for_backward({rows, weight});
    ctx->saved_data["x_shape"] = x.sizes().vec();
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = weight.size(0);
    return at::addmm(bias, rows, weight.t()).view(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &rows = saved[0], &weight = saved[1];
    const at::Tensor dy = grads[0].reshape({-1, weight.size(0)}).to(weight.scalar_type()).contiguous();
    at::Tensor dx, dw, db;
    if (ctx->needs_input_grad(0)) dx = at::mm(dy, weight).view(ctx->saved_data["x_shape"].toIntVector());
    const bool want_dw = ctx->needs_input_grad(1), want_db = ctx->needs_input_grad(2);
    if (!(want_dw && want_db && weight_and_bias_gradient_cublaslt(rows, dy, dw, db))) {
      if (want_dw) dw = at::mm(dy.t(), rows);
      if (want_db) db = dy.sum(0);
    }
    return {dx, want_dw ? dw : at::Tensor(), want_db ? db : at::Tensor()};
  }
};

}  // namespace

at::Tensor linear_bias_gradient_in_gemm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return LinearBiasGradientInGemm::apply(x, weight, bias);
}

at::Tensor linear_cublaslt_cuda(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  if (!bias || !x.is_cuda() || !weight.is_cuda() || !bias->is_cuda() || weight.dim() != 2 || bias->dim() != 1 || x.dim() < 1 ||
      x.numel() == 0 || x.size(-1) != weight.size(1) || bias->size(0) != weight.size(0))
    return at::linear(x, weight, bias);
  // The type the GEMMs run in: autocast's for a Linear where it is on, else the operands'.
  const bool autocast = at::autocast::is_autocast_enabled(c10::DeviceType::CUDA);
  const at::ScalarType dtype = autocast ? at::autocast::get_autocast_dtype(c10::DeviceType::CUDA) : x.scalar_type();
  if (!half_type(dtype)) return at::linear(x, weight, bias);
  // Autocast's own casts (cached: a weight is cast once per forward), then no autocast below.
  const auto cast = [&](const at::Tensor& t) { return autocast ? at::autocast::cached_cast(dtype, t, c10::DeviceType::CUDA) : t; };
  const at::Tensor x16 = cast(x), w16 = cast(weight), b16 = cast(*bias);
  if (x16.scalar_type() != dtype || w16.scalar_type() != dtype || b16.scalar_type() != dtype) return at::linear(x, weight, bias);
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  return linear_bias_gradient_in_gemm(x16, w16, b16);
}

}  // namespace strata::kernels
