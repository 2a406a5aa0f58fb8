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

// The kernels' outputs for one call: the norm y, the saved mean and rstd; and for add_layer_norm the
// sum. `branch` undefined: the norm of x.
struct Forward {
  at::Tensor y, mean, rstd, sum;
};
Forward run_forward(const at::Tensor& x, const at::Tensor& branch, const at::Tensor& w, const at::Tensor& b, double eps,
                    at::ScalarType out_type) {
  const bool has_bias = b.numel() > 0;
  const int64_t dim = x.size(-1), rows = x.numel() / dim;
  Forward f{at::empty_like(x, x.options().dtype(out_type)), at::empty({rows}, x.options()), at::empty({rows}, x.options()),
            branch.defined() ? at::empty_like(x) : at::Tensor()};
  check_launch(cuda::layer_norm_forward(x.const_data_ptr<float>(), branch.defined() ? branch.const_data_ptr() : nullptr,
                                        branch.defined() ? storage_of(branch.scalar_type()) : cuda::Storage::Float,
                                        branch.defined() ? f.sum.mutable_data_ptr<float>() : nullptr, w.const_data_ptr<float>(),
                                        has_bias ? b.const_data_ptr<float>() : nullptr, f.y.mutable_data_ptr(), storage_of(out_type),
                                        f.mean.mutable_data_ptr<float>(), f.rstd.mutable_data_ptr<float>(), rows, dim, eps, current_stream()),
               "forward");
  return f;
}

// dx of the norm of x (plus dx_plus where defined; also stored as branch_type in dx_branch where
// that is defined), dw and db (undefined without a bias).
struct Backward {
  at::Tensor dx, dw, db;
};
Backward run_backward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& mean, const at::Tensor& rstd, const at::Tensor& grad,
                      bool has_bias, const at::Tensor& dx_plus, const at::Tensor& dx_branch) {
  const int64_t dim = x.size(-1), rows = x.numel() / dim;
  // dy as it comes (the output's dtype); any other dtype is read as float.
  const at::Tensor dy = (grad.scalar_type() == at::kBFloat16 || grad.scalar_type() == at::kHalf ? grad : grad.to(at::kFloat)).contiguous();
  at::Tensor dx = at::empty_like(x);
  // One buffer for both partial sums: one memset, one reduction.
  const int64_t groups = cuda::layer_norm_backward_groups(rows);
  at::Tensor partial = at::zeros({has_bias ? 2 : 1, groups, dim}, x.options());
  check_launch(cuda::layer_norm_backward(x.const_data_ptr<float>(), w.const_data_ptr<float>(), mean.const_data_ptr<float>(),
                                         rstd.const_data_ptr<float>(), dy.const_data_ptr(), storage_of(dy.scalar_type()),
                                         dx.mutable_data_ptr<float>(), dx_plus.defined() ? dx_plus.const_data_ptr<float>() : nullptr,
                                         dx_branch.defined() ? dx_branch.mutable_data_ptr() : nullptr,
                                         dx_branch.defined() ? storage_of(dx_branch.scalar_type()) : cuda::Storage::Float,
                                         partial[0].mutable_data_ptr<float>(), has_bias ? partial[1].mutable_data_ptr<float>() : nullptr,
                                         rows, dim, current_stream()),
               "backward");
  const at::Tensor sums = partial.sum(1);
  return {dx, sums[0], has_bias ? sums[1] : at::Tensor()};
}

class LayerNormCuda : public torch::autograd::Function<LayerNormCuda> {
 public:
  // bias: an empty tensor for none. out_type: the output's dtype, float or autocast's 16-bit one.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias, double eps,
                            at::ScalarType out_type) {
    const c10::cuda::CUDAGuard guard(input.device());
    const at::Tensor x = input.contiguous(), w = weight.contiguous(), b = bias.contiguous();
    const Forward f = run_forward(x, at::Tensor(), w, b, eps, out_type);
    ctx->save_for_backward({x, w, f.mean, f.rstd});
    ctx->saved_data["has_bias"] = b.numel() > 0;
    return f.y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const c10::cuda::CUDAGuard guard(saved[0].device());
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const Backward g = run_backward(saved[0], saved[1], saved[2], saved[3], grads[0], has_bias, at::Tensor(), at::Tensor());
    return {g.dx, g.dw, g.db, at::Tensor(), at::Tensor()};
  }
};

// {sum, norm(sum)} with sum = residual + branch: the add in the forward kernel's first read of
// each row; backward, the sum's incoming gradient added to dx and the branch's 16-bit gradient
// stored, in the backward kernel. Saves the sum (an output, alive anyway) as the norm saves x.
class AddLayerNormCuda : public torch::autograd::Function<AddLayerNormCuda> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& residual, const at::Tensor& branch, const at::Tensor& weight,
                               const at::Tensor& bias, double eps, at::ScalarType out_type) {
    const c10::cuda::CUDAGuard guard(residual.device());
    const at::Tensor r = residual.contiguous(), x = branch.contiguous(), w = weight.contiguous(), b = bias.contiguous();
    const Forward f = run_forward(r, x, w, b, eps, out_type);
    ctx->save_for_backward({f.sum, w, f.mean, f.rstd});
    ctx->saved_data["has_bias"] = b.numel() > 0;
    ctx->saved_data["branch_type"] = static_cast<int64_t>(x.scalar_type());
    return {f.sum, f.y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& sum = saved[0];
    const c10::cuda::CUDAGuard guard(sum.device());
    const auto branch_type = static_cast<at::ScalarType>(ctx->saved_data["branch_type"].toInt());
    const at::Tensor plus = grads[0].defined() ? grads[0].to(at::kFloat).contiguous() : at::Tensor();
    if (!grads[1].defined())  // the norm's output unused: the add's gradient only
      return {plus, plus.defined() ? plus.to(branch_type) : plus, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const at::Tensor dx_branch = branch_type == at::kFloat ? at::Tensor() : at::empty_like(sum, sum.options().dtype(branch_type));
    const Backward g = run_backward(sum, saved[1], saved[2], saved[3], grads[1], ctx->saved_data["has_bias"].toBool(), plus, dx_branch);
    return {g.dx, dx_branch.defined() ? dx_branch : g.dx, g.dw, g.db, at::Tensor(), at::Tensor()};
  }
};

// add_layer_norm's calls the kernels take: an fp32 residual of x's shape on x's device, x fp32 or
// bf16/half, fp32 weight and bias; and `norm_impl` (layer_norm.fused_cuda or its autocast-output
// form) serves layer_norm in this block, so a pinned norm is never bypassed.
bool add_takes(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
               const char* norm_impl) {
  const auto t = x.scalar_type();
  return takes(residual, weight, bias) && residual.sizes() == x.sizes() && x.device() == residual.device() &&
         (t == at::kFloat || t == at::kBFloat16 || t == at::kHalf) && ops::select("layer_norm", residual).name() == norm_impl;
}

ops::AddNormResult add_layer_norm_reference_call(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight,
                                                 const std::optional<at::Tensor>& bias, double eps) {
  const auto& reference =
      static_cast<const ops::OperatorImpl<ops::AddLayerNorm>&>(*ops::implementations("add_layer_norm").back());
  return reference.fn()(residual, x, weight, bias, eps);
}

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

ops::AddNormResult add_layer_norm_fused_cuda(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight,
                                             const std::optional<at::Tensor>& bias, double eps) {
  // The norm's output dtype follows whichever of the two implementations serves layer_norm here.
  at::ScalarType out = at::kFloat;
  if (add_takes(residual, x, weight, bias, "layer_norm.autocast_out_cuda")) out = cuda_autocast_half_type().value_or(at::kFloat);
  else if (!add_takes(residual, x, weight, bias, "layer_norm.fused_cuda")) return add_layer_norm_reference_call(residual, x, weight, bias, eps);
  const auto outputs =
      AddLayerNormCuda::apply(residual, x, weight, bias ? *bias : at::empty({0}, weight.options().requires_grad(false)), eps, out);
  return {outputs[0], outputs[1]};
}

}  // namespace strata::kernels
