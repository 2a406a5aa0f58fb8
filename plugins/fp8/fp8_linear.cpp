#include "fp8_linear.h"

#include <torch/csrc/autograd/custom_function.h>

#include "strata/cpu.h"

namespace strata::fp8 {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor Scaling::scale_for(int64_t index, const at::Tensor& x, Format format) {
  at::NoGradGuard no_grad;
  auto own_scale = [&] {
    at::Tensor a = abs_max(x);
    if (current_group) current_group->all_reduce(a, ReduceOp::Max)->wait();
    const at::Tensor fp8_max = at::full({}, max_of(format), a.options());
    return scale_from_amax(a, fp8_max, margin, at::ones({}, a.options()));
  };
  if (recipe == Recipe::Current) return own_scale();
  if (!evaluating) delayed->observe(index, abs_max(x));
  if (!delayed->updated) return own_scale();
  // A copy: the state's scale changes in place after the step, and backward must dequantize with
  // the scale the forward quantized with.
  return delayed->scale.select(0, index).clone();
}

namespace {

// ATen's CPU _scaled_mm goes through oneDNN's fp8 matmul where cpuinfo reports AMX-INT8 and
// emulates the product otherwise (the fp8 values, exact in fp32, multiplied in fp32, then
// scaled). On a Xeon with AMX oneDNN's fp8 matmul ran about 1000x slower than that product
// (torch 2.11, one thread: 256^3 in 1.25 s against 1.25 ms; 64^3 in 10.6 ms against 0.07 ms), so
// there Strata computes the product itself; elsewhere ATen's _scaled_mm serves where a trial call
// runs it. Under STRATA_CPU_FALLBACK=fp8_scaled_mm the product serves everywhere.
CpuPathChoice decide_cpu_scaled_mm() {
  CpuPathChoice c{"fp8_scaled_mm", "fp8 GEMMs on the CPU", "fp32 product of the fp8 values", "", false};
  if (cpu_fallback_forced(c.path)) return c.why = "forced by STRATA_CPU_FALLBACK", c;
  if (cpu_has(CpuFeature::amx_int8))
    return c.why = "ATen's _scaled_mm would take oneDNN's fp8 matmul here (AMX-INT8), measured about 1000x slower", c;
  try {
    const at::Tensor a = at::ones({16, 16}).to(at::kFloat8_e4m3fn), one = at::ones({});
    const at::Tensor y = at::_scaled_mm(a, a.t().contiguous().t(), one, one, std::nullopt, std::nullopt, at::kFloat);
    if (!at::equal(y, at::full({16, 16}, 16.0f))) return c.why = "ATen's _scaled_mm gave a wrong result in a trial call", c;
  } catch (const std::exception& e) {
    const std::string what = e.what();
    return c.why = "ATen's _scaled_mm refused a trial call: " + what.substr(0, what.find('\n')), c;
  }
  c.chosen = "ATen's _scaled_mm", c.fast = true;
  c.why = "a trial call ran (ATen emulates the product: no AMX-INT8)";
  return c;
}

}  // namespace

bool cpu_scaled_mm_chosen() {
  static const bool chosen = decide_cpu_path(&decide_cpu_scaled_mm);
  return chosen;
}

at::Tensor scaled_matmul(const at::Tensor& a, const at::Tensor& b, const at::Tensor& a_scale, const at::Tensor& b_scale) {
  // A tensor-parallel piece need not be a multiple of 16 (fp8_layers.h), which ATen's kernels may want.
  const bool aligned = a.size(1) % 16 == 0 && b.size(1) % 16 == 0;
  if (a.device().is_cpu() && (!cpu_scaled_mm_chosen() || !aligned))
    return a.to(at::kFloat).mm(b.to(at::kFloat)).mul_(a_scale).mul_(b_scale);
  return at::_scaled_mm(a.contiguous(), b.t().contiguous().t(), a_scale, b_scale, std::nullopt, std::nullopt, at::kFloat);
}

namespace {

class Fp8LinearFunction : public torch::autograd::Function<Fp8LinearFunction> {
 public:
  // b: the bias, or an empty tensor for none (autograd functions take defined tensors).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, Scaling* scaling,
                            int64_t layer, at::ScalarType out_dtype) {
    const int64_t in = w.size(1), out = w.size(0);
    const at::Tensor x2 = x.reshape({-1, in});
    const at::Tensor x_scale = scaling->scale_for(3 * layer, x2, scaling->forward);
    const at::Tensor w_scale = scaling->scale_for(3 * layer + 1, w, scaling->forward);
    const at::Tensor xq = quantize(x2, x_scale, scaling->forward);
    const at::Tensor wq = quantize(w, w_scale, scaling->forward);
    at::Tensor y = scaled_matmul(xq, wq.t(), x_scale.reciprocal(), w_scale.reciprocal());
    const bool has_bias = b.numel() > 0;
    if (has_bias) y.add_(b.to(at::kFloat));
    // The fp8 operands are what backward needs (a quarter of fp32 activations).
    ctx->save_for_backward({xq, wq, x_scale, w_scale});
    ctx->saved_data["scaling"] = reinterpret_cast<int64_t>(scaling);
    ctx->saved_data["layer"] = layer;
    ctx->saved_data["x_sizes"] = x.sizes().vec();
    ctx->saved_data["x_dtype"] = x.scalar_type();
    ctx->saved_data["w_dtype"] = w.scalar_type();
    ctx->saved_data["b_dtype"] = b.scalar_type();
    ctx->saved_data["has_bias"] = has_bias;
    std::vector<int64_t> out_sizes = x.sizes().vec();
    out_sizes.back() = out;
    return y.to(out_dtype).reshape(out_sizes);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &xq = saved[0], &wq = saved[1], &x_scale = saved[2], &w_scale = saved[3];
    auto* scaling = reinterpret_cast<Scaling*>(ctx->saved_data["scaling"].toInt());
    const int64_t layer = ctx->saved_data["layer"].toInt();
    const at::Tensor g = grad_outputs[0].reshape({-1, wq.size(0)});
    const at::Tensor g_scale = scaling->scale_for(3 * layer + 2, g, scaling->backward);
    const at::Tensor gq = quantize(g, g_scale, scaling->backward);
    const at::Tensor g_inverse = g_scale.reciprocal();
    at::Tensor grad_x, grad_w, grad_b;
    if (ctx->needs_input_grad(0))  // dx = dy w: [M, out] @ [out, in]
      grad_x = scaled_matmul(gq, wq, g_inverse, w_scale.reciprocal())
                   .to(ctx->saved_data["x_dtype"].toScalarType())
                   .reshape(ctx->saved_data["x_sizes"].toIntVector());
    if (ctx->needs_input_grad(1))  // dw = dy^T x: [out, M] @ [M, in]
      grad_w = scaled_matmul(gq.t(), xq, g_inverse, x_scale.reciprocal()).to(ctx->saved_data["w_dtype"].toScalarType());
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2))  // in high precision, like the bias itself
      grad_b = g.to(at::kFloat).sum(0).to(ctx->saved_data["b_dtype"].toScalarType());
    return {grad_x, grad_w, grad_b, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor fp8_linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b, Scaling& scaling,
                      int64_t layer, at::ScalarType out_dtype) {
  const at::Tensor bias = b.has_value() ? *b : at::empty({0}, w.options().requires_grad(false));
  return Fp8LinearFunction::apply(x, w, bias, &scaling, layer, out_dtype);
}

}  // namespace strata::fp8
