// The autograd of layer_norm.fused_cuda (layer_norm_cuda.h): launches the kernels of
// layer_norm_kernels.h on the tensors' device and current stream.
#include "cuda/layer_norm_cuda.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/custom_function.h>

#include "cuda/autocast_half.h"
#include "cuda/layer_norm_kernels.h"
#include "cuda/storage_of.h"
#include "strata/ops.h"

namespace strata::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void check_launch(int error, const char* what) {
  TORCH_CHECK(error == 0, "layer_norm: CUDA kernel launch failed in ", what, " (cudaError ", error, ")");
}

void* current_stream() { return static_cast<void*>(c10::cuda::getCurrentCUDAStream().stream()); }

bool fp32_vector_on(const at::Tensor& t, const at::Tensor& x) {
  return t.scalar_type() == at::kFloat && t.device() == x.device() && t.dim() == 1 && t.size(0) == x.size(-1);
}

// fp32 x on a GPU with fp32 1-D weight (and bias) of x's last size.
bool takes(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  return x.is_cuda() && x.scalar_type() == at::kFloat && x.dim() >= 1 && x.size(-1) > 0 && fp32_vector_on(weight, x) &&
         (!bias || fp32_vector_on(*bias, x));
}

class LayerNormCuda : public torch::autograd::Function<LayerNormCuda> {
 public:
  // bias: an empty tensor for none. out_type: the output's dtype, float or autocast's 16-bit one.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias, double eps,
                            at::ScalarType out_type) {
    const c10::cuda::CUDAGuard guard(input.device());
    const at::Tensor x = input.contiguous(), w = weight.contiguous(), b = bias.contiguous();
    const bool has_bias = b.numel() > 0;
    const int64_t dim = x.size(-1), rows = x.numel() / dim;
    at::Tensor y = at::empty_like(x, x.options().dtype(out_type)), mean = at::empty({rows}, x.options()), rstd = at::empty({rows}, x.options());
    check_launch(cuda::layer_norm_forward(x.const_data_ptr<float>(), w.const_data_ptr<float>(), has_bias ? b.const_data_ptr<float>() : nullptr,
                                          y.mutable_data_ptr(), storage_of(out_type), mean.mutable_data_ptr<float>(),
                                          rstd.mutable_data_ptr<float>(), rows, dim, eps, current_stream()),
                 "forward");
    ctx->save_for_backward({x, w, mean, rstd});
    ctx->saved_data["has_bias"] = has_bias;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &mean = saved[2], &rstd = saved[3];
    const c10::cuda::CUDAGuard guard(x.device());
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const int64_t dim = x.size(-1), rows = x.numel() / dim;
    // dy as it comes (the output's dtype); any other dtype is read as float.
    const at::Tensor g = grads[0];
    const at::Tensor dy = (g.scalar_type() == at::kBFloat16 || g.scalar_type() == at::kHalf ? g : g.to(at::kFloat)).contiguous();
    at::Tensor dx = at::empty_like(x);
    // One buffer for both partial sums: one memset, one reduction.
    const int64_t groups = cuda::layer_norm_backward_groups(rows);
    at::Tensor partial = at::zeros({has_bias ? 2 : 1, groups, dim}, x.options());
    check_launch(cuda::layer_norm_backward(x.const_data_ptr<float>(), w.const_data_ptr<float>(), mean.const_data_ptr<float>(),
                                           rstd.const_data_ptr<float>(), dy.const_data_ptr(), storage_of(dy.scalar_type()),
                                           dx.mutable_data_ptr<float>(),
                                           partial[0].mutable_data_ptr<float>(), has_bias ? partial[1].mutable_data_ptr<float>() : nullptr,
                                           rows, dim, current_stream()),
                 "backward");
    const at::Tensor sums = partial.sum(1);
    return {dx, sums[0], has_bias ? sums[1] : at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor layer_norm_fused_cuda(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias, double eps) {
  if (!takes(x, weight, bias)) {
    const auto& reference = static_cast<const ops::OperatorImpl<ops::LayerNorm>&>(*ops::implementations("layer_norm").back());
    return reference.fn()(x, weight, bias, eps);
  }
  return LayerNormCuda::apply(x, weight, bias ? *bias : at::empty({0}, weight.options().requires_grad(false)), eps, at::kFloat);
}

at::Tensor layer_norm_autocast_out_cuda(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias, double eps) {
  const std::optional<at::ScalarType> out = cuda_autocast_half_type();
  if (!out || !takes(x, weight, bias)) return layer_norm_fused_cuda(x, weight, bias, eps);
  return LayerNormCuda::apply(x, weight, bias ? *bias : at::empty({0}, weight.options().requires_grad(false)), eps, *out);
}

}  // namespace strata::kernels
