// The autograd of the fused RMSNorm, shared by the CPU kernel (rms_norm.cpp) and the CUDA one
// (kernels/cuda/rms_norm_cuda.cpp). The arithmetic is core's rms_norm.reference (Hugging Face's
// LlamaRMSNorm) with its roundings (kernels/cuda/rms_norm_kernels.h gives the formulas); the
// forward saves x, the weight and one fp32 rstd per row, where the reference saves fp32 copies of
// the activation. `Kernels` supplies the passes over contiguous rows x dim tensors:
//   static void forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& y,
//                       const at::Tensor& rstd, double eps);
//   static int64_t backward_groups(int64_t rows);   // row groups, each with its own dw partial sum
//   static void backward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& rstd,
//                        const at::Tensor& dy, const at::Tensor& dx, const at::Tensor& dw_partial);
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "strata/ops.h"

namespace strata::kernels {

// Whether the fused kernels take this call: x float, bfloat16 or half on the kernel's device, a
// 1-D weight of x's last size in x's dtype or fp32.
inline bool rms_norm_fused_takes(const at::Tensor& x, const at::Tensor& weight, c10::DeviceType device) {
  const auto t = x.scalar_type();
  return x.device().type() == device && weight.device().type() == device && x.dim() >= 1 &&
         (t == at::kFloat || t == at::kBFloat16 || t == at::kHalf) && weight.dim() == 1 && weight.size(0) == x.size(-1) &&
         (weight.scalar_type() == t || weight.scalar_type() == at::kFloat);
}

// A call the kernels do not take (a bf16 weight on fp32 x, a broadcast weight): the reference.
inline at::Tensor rms_norm_reference_call(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const auto& reference = static_cast<const ops::OperatorImpl<ops::RmsNorm>&>(*ops::implementations("rms_norm").back());
  return reference.fn()(x, weight, eps);
}

// RmsNormFunction's out_dtype: the reference's promotion of x's and the weight's dtypes.
constexpr int64_t kPromotedOutput = -1;

template <class Kernels>
class RmsNormFunction : public torch::autograd::Function<RmsNormFunction<Kernels>> {
 public:
  // out_dtype: kPromotedOutput, or (rms_norm.autocast_out_cuda, fp32 x and weight) autocast's
  // 16-bit ScalarType as an integer.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight, double eps,
                            int64_t out_dtype) {
    const at::Tensor x = input.contiguous(), w = weight.contiguous();
    const int64_t rows = x.size(-1) > 0 ? x.numel() / x.size(-1) : 0;
    // The reference's w * n promotes: fp32 with an fp32 weight, else x's dtype.
    const at::ScalarType out = out_dtype == kPromotedOutput ? at::promote_types(x.scalar_type(), w.scalar_type())
                                                            : static_cast<at::ScalarType>(out_dtype);
    at::Tensor y = at::empty(x.sizes(), x.options().dtype(out));
    at::Tensor rstd = at::empty({rows}, x.options().dtype(at::kFloat));
    Kernels::forward(x, w, y, rstd, eps);
    ctx->save_for_backward({x, w, rstd});
    ctx->saved_data["out_dtype"] = static_cast<int64_t>(out);
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &rstd = saved[2];
    const int64_t dim = x.size(-1), rows = dim > 0 ? x.numel() / dim : 0;
    const at::Tensor dy = grads[0].to(static_cast<at::ScalarType>(ctx->saved_data["out_dtype"].toInt())).contiguous();
    at::Tensor dx = at::empty_like(x);
    at::Tensor partial = at::zeros({Kernels::backward_groups(rows), dim}, x.options().dtype(at::kFloat));
    Kernels::backward(x, w, rstd, dy, dx, partial);
    return {dx, partial.sum(0).to(w.scalar_type()), at::Tensor(), at::Tensor()};
  }
};

}  // namespace strata::kernels
