#include "fp8_rowwise.h"

#include <torch/csrc/autograd/custom_function.h>

#include "fp8_linear.h"

namespace strata::fp8 {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor axis_scale(const at::Tensor& x, int64_t dim, Communicator* group, Format format, int64_t margin) {
  at::NoGradGuard no_grad;
  at::Tensor amax = x.abs().amax({dim}, /*keepdim=*/true).to(at::kFloat).contiguous();
  if (group) group->all_reduce(amax, ReduceOp::Max)->wait();
  const at::Tensor fp8_max = at::full({}, max_of(format), amax.options());
  return scale_from_amax(amax, fp8_max, margin, at::ones_like(amax));
}

at::Tensor rowwise_matmul(const at::Tensor& a, const at::Tensor& b, const at::Tensor& a_inverse, const at::Tensor& b_inverse) {
  const at::Tensor one = at::ones({}, a_inverse.options());
  return scaled_matmul(a, b, one, one).mul_(a_inverse).mul_(b_inverse);
}

namespace {

// Quantizes x along `dim` (see axis_scale) and returns the fp8 tensor and the inverse scales.
std::pair<at::Tensor, at::Tensor> quantize_along(const at::Tensor& x, int64_t dim, Communicator* group, Format format,
                                                 int64_t margin) {
  const at::Tensor scale = axis_scale(x, dim, group, format, margin);
  return {quantize(x, scale, format), scale.reciprocal()};
}

class Fp8RowwiseLinearFunction : public torch::autograd::Function<Fp8RowwiseLinearFunction> {
 public:
  // b: the bias, or an empty tensor for none (autograd functions take defined tensors).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                            const RowwiseScaling* scaling, at::ScalarType out_dtype) {
    const int64_t in = w.size(1), out = w.size(0);
    const at::Tensor x2 = x.reshape({-1, in});
    const auto [xq, x_inverse] = quantize_along(x2, 1, scaling->in_split, scaling->forward, scaling->margin);  // [M, 1]
    const auto [wq, w_inverse] = quantize_along(w, 1, scaling->in_split, scaling->forward, scaling->margin);   // [out, 1]
    at::Tensor y = rowwise_matmul(xq, wq.t(), x_inverse, w_inverse.t());
    const bool has_bias = b.numel() > 0;
    if (has_bias) y.add_(b.to(at::kFloat));
    ctx->save_for_backward({x2, w});
    ctx->saved_data["scaling"] = reinterpret_cast<int64_t>(scaling);
    ctx->saved_data["x_sizes"] = x.sizes().vec();
    ctx->saved_data["b_dtype"] = b.scalar_type();
    ctx->saved_data["has_bias"] = has_bias;
    std::vector<int64_t> out_sizes = x.sizes().vec();
    out_sizes.back() = out;
    return y.to(out_dtype).reshape(out_sizes);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x2 = saved[0], &w = saved[1];
    const auto* scaling = reinterpret_cast<const RowwiseScaling*>(ctx->saved_data["scaling"].toInt());
    const at::Tensor g = grad_outputs[0].reshape({-1, w.size(0)});
    const Format forward = scaling->forward, backward = scaling->backward;
    const int64_t margin = scaling->margin;
    at::Tensor grad_x, grad_w, grad_b;
    if (ctx->needs_input_grad(0)) {  // dx = dy w, over out: dy per token, w per input feature
      const auto [gq, g_inverse] = quantize_along(g, 1, scaling->out_split, backward, margin);
      const auto [wq, w_inverse] = quantize_along(w, 0, scaling->out_split, forward, margin);
      grad_x = rowwise_matmul(gq, wq, g_inverse, w_inverse).to(x2.scalar_type()).reshape(ctx->saved_data["x_sizes"].toIntVector());
    }
    if (ctx->needs_input_grad(1)) {  // dw = dy^T x, over tokens: dy per output feature, x per input feature
      const auto [gq, g_inverse] = quantize_along(g, 0, scaling->tokens, backward, margin);
      const auto [xq, x_inverse] = quantize_along(x2, 0, scaling->tokens, forward, margin);
      grad_w = rowwise_matmul(gq.t(), xq, g_inverse.t(), x_inverse).to(w.scalar_type());
    }
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2))  // in high precision, like the bias itself
      grad_b = g.to(at::kFloat).sum(0).to(ctx->saved_data["b_dtype"].toScalarType());
    return {grad_x, grad_w, grad_b, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor fp8_linear_rowwise(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b,
                              const RowwiseScaling& scaling, at::ScalarType out_dtype) {
  const at::Tensor bias = b.has_value() ? *b : at::empty({0}, w.options().requires_grad(false));
  return Fp8RowwiseLinearFunction::apply(x, w, bias, &scaling, out_dtype);
}

}  // namespace strata::fp8
