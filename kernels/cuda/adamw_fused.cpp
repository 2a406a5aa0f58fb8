// adamw_fused.h. ATen's fused kernel computes, per element and in fp32 registers:
//   p *= 1 - lr wd;  m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2;
//   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// the reference's rule with its operations fused (the moments' rounding may differ in the last
// bit: the reference's lerp is another formula for the same m). It reads the step t from a
// tensor on the device; one such tensor per step value is kept and shared by every parameter.
#include "cuda/adamw_fused.h"

#include <ATen/ATen.h>

namespace strata::kernels {

void adamw_update_fused_cuda(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                             const at::Tensor& exp_avg_sq, const ops::AdamwHyper& hyper) {
  TORCH_CHECK(param.is_cuda() && param.scalar_type() == at::kFloat, "adamw_update.fused_cuda: fp32 CUDA parameters only");
  // The step as ATen's kernel wants it: a float tensor on the parameter's device, made once per
  // (device, step) rather than once per parameter. Thread-local: optimizers step on one thread.
  thread_local at::Tensor step;
  thread_local int64_t step_value = -1;
  if (!step.defined() || step_value != hyper.step || step.device() != param.device()) {
    step = at::full({}, static_cast<double>(hyper.step), param.options());
    step_value = hyper.step;
  }
  at::NoGradGuard no_grad;
  at::_fused_adamw_({param}, {grad}, {exp_avg}, {exp_avg_sq}, {}, {step}, hyper.lr, hyper.beta1, hyper.beta2,
                    hyper.weight_decay, hyper.eps, /*amsgrad=*/false, /*maximize=*/false);
}

}  // namespace strata::kernels
