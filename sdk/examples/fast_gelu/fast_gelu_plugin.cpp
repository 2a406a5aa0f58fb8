// Example operator implementation: the tanh-approximated GELU of the `gelu` operator, computed
// for fp32 CPU tensors in one loop forward and one loop backward (the reference composes ATen
// kernels). Its Support says fp32 on CPU, and its priority (20) is above Strata's own fused CPU
// kernel's (10): it serves fp32 CPU calls, and every other dtype and device goes on to the next
// implementation that supports it (Strata's gelu.fused_cpu, the reference): the override never
// changes what it does not handle.
#include <cmath>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include "strata/plugin.h"

namespace fast_gelu {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f, kCubic = 0.044715f;

// gelu(x) = 0.5 x (1 + tanh(k (x + c x^3))), k = sqrt(2/pi), c = 0.044715
class Gelu : public torch::autograd::Function<Gelu> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input) {
    at::Tensor x = input.contiguous(), y = at::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* out = y.data_ptr<float>();
    at::parallel_for(0, x.numel(), 16384, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const float v = in[i];
        out[i] = 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + kCubic * v * v * v)));
      }
    });
    ctx->save_for_backward({x});
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    at::Tensor x = ctx->get_saved_variables()[0], g = grad_outputs[0].contiguous(), dx = at::empty_like(x);
    const float *in = x.data_ptr<float>(), *up = g.data_ptr<float>();
    float* out = dx.data_ptr<float>();
    at::parallel_for(0, x.numel(), 16384, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const float v = in[i], t = std::tanh(kSqrt2OverPi * (v + kCubic * v * v * v));
        const float inner_grad = kSqrt2OverPi * (1.0f + 3.0f * kCubic * v * v);
        out[i] = up[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * inner_grad);
      }
    });
    return {dx};
  }
};

at::Tensor gelu_fp32_cpu(const at::Tensor& x) { return Gelu::apply(x); }

void register_components(strata::Registry& registry) {
  registry.add(std::make_unique<strata::ops::OperatorImpl<strata::ops::Gelu>>(
      "gelu.fast_fp32_cpu", "tanh GELU in one loop each way (fp32, CPU)", &gelu_fp32_cpu,
      strata::ops::Support{{c10::DeviceType::CPU}, {at::kFloat}}, /*priority=*/20));
}

}  // namespace
}  // namespace fast_gelu

STRATA_PLUGIN("fast_gelu", "0.1.0", fast_gelu::register_components)
