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

// add_rms_norm (ops::AddRmsNorm): whether the fused kernels take the call. The residual has the
// sum's dtype (ATen's promotion of the two) and x's shape, x is of that dtype or, for an fp32
// sum, bf16/half (autocast's branch output); the sum and weight pass rms_norm_fused_takes; and
// `norm_impl` serves rms_norm in this block, so a block whose norm is pinned to another
// implementation gets the add and its pinned norm (the reference), never these kernels' norm.
inline bool add_rms_norm_fused_takes(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight,
                                     c10::DeviceType device, const char* norm_impl) {
  const auto sum_type = at::promote_types(residual.scalar_type(), x.scalar_type());
  const bool promoted_branch = sum_type == at::kFloat && (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf);
  return residual.scalar_type() == sum_type && (x.scalar_type() == sum_type || promoted_branch) && residual.sizes() == x.sizes() &&
         x.device() == residual.device() && rms_norm_fused_takes(residual, weight, device) &&
         ops::select("rms_norm", residual).name() == norm_impl;
}

inline ops::AddNormResult add_rms_norm_reference_call(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight,
                                                      double eps) {
  const auto& reference =
      static_cast<const ops::OperatorImpl<ops::AddRmsNorm>&>(*ops::implementations("add_rms_norm").back());
  return reference.fn()(residual, x, weight, eps);
}

// {sum, norm(sum)}, sum = residual + x. Forward: Kernels::add_forward(residual, x, w, sum, y, rstd,
// eps) writes both; it saves the sum (an output, kept alive anyway) where the unfused step saves
// the norm's input. Backward: Kernels::backward(sum, w, rstd, dy, dx, partial, dx_plus, dx_branch)
// with dx_plus = the sum's own incoming gradient, so the norm's dx and the residual path's
// gradient are added in the same pass; x's gradient is that sum, which the kernels also store in
// dx_branch (x's dtype) where it differs from the sum's (no cast kernel after). out_dtype as
// RmsNormFunction's.
template <class Kernels>
class AddRmsNormFunction : public torch::autograd::Function<AddRmsNormFunction<Kernels>> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& residual,
                                                const at::Tensor& input, const at::Tensor& weight, double eps, int64_t out_dtype) {
    const at::Tensor r = residual.contiguous(), x = input.contiguous(), w = weight.contiguous();
    const int64_t rows = r.size(-1) > 0 ? r.numel() / r.size(-1) : 0;
    const at::ScalarType out = out_dtype == kPromotedOutput ? at::promote_types(r.scalar_type(), w.scalar_type())
                                                            : static_cast<at::ScalarType>(out_dtype);
    at::Tensor sum = at::empty(r.sizes(), r.options());
    at::Tensor y = at::empty(r.sizes(), r.options().dtype(out));
    at::Tensor rstd = at::empty({rows}, r.options().dtype(at::kFloat));
    Kernels::add_forward(r, x, w, sum, y, rstd, eps);
    ctx->save_for_backward({sum, w, rstd});
    ctx->saved_data["out_dtype"] = static_cast<int64_t>(out);
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    return {sum, y};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor &sum = saved[0], &w = saved[1], &rstd = saved[2];
    const auto x_dtype = static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    const at::Tensor plus = grads[0].defined() ? grads[0].to(sum.scalar_type()).contiguous() : at::Tensor();
    if (!grads[1].defined())  // the norm's output unused: the add's gradient only
      return {plus, plus.defined() ? plus.to(x_dtype) : plus, at::Tensor(), at::Tensor(), at::Tensor()};
    const int64_t dim = sum.size(-1), rows = dim > 0 ? sum.numel() / dim : 0;
    const at::Tensor dy = grads[1].to(static_cast<at::ScalarType>(ctx->saved_data["out_dtype"].toInt())).contiguous();
    at::Tensor dsum = at::empty_like(sum);
    at::Tensor partial = at::zeros({Kernels::backward_groups(rows), dim}, sum.options().dtype(at::kFloat));
    const at::Tensor dx_branch = x_dtype == sum.scalar_type() ? at::Tensor() : at::empty_like(sum, sum.options().dtype(x_dtype));
    Kernels::backward(sum, w, rstd, dy, dsum, partial, plus, dx_branch);
    return {dsum, dx_branch.defined() ? dx_branch : dsum, partial.sum(0).to(w.scalar_type()), at::Tensor(), at::Tensor()};
  }
};

}  // namespace strata::kernels
