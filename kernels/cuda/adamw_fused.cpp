// adamw_fused.h. ATen's fused kernel computes, per element and in fp32 registers:
//   p *= 1 - lr wd;  m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2;
//   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// the reference's rule with its operations fused (the moments' rounding may differ in the last
// bit: the reference's lerp is another formula for the same m), over the group's lists in
// multi-tensor launches. It reads the step t from a tensor on the device; one such tensor per
// step value is kept and shared by every parameter.
#include "cuda/adamw_fused.h"

#include <ATen/ATen.h>

namespace strata::kernels {

void adamw_update_fused_cuda(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                             const ops::AdamwHyper& hyper) {
  if (params.empty()) return;
  const c10::Device device = params.front().device();
  for (const at::Tensor& p : params)
    TORCH_CHECK(p.is_cuda() && p.device() == device && p.scalar_type() == at::kFloat,
                "adamw_update.fused_cuda: fp32 parameters on one CUDA device only");
  // The step as ATen's kernel wants it: a float tensor on the parameters' device, made once per
  // (device, step) rather than once per call. Thread-local: optimizers step on one thread.
  thread_local at::Tensor step;
  thread_local int64_t step_value = -1;
  if (!step.defined() || step_value != hyper.step || step.device() != device) {
    step = at::full({}, static_cast<double>(hyper.step), params.front().options());
    step_value = hyper.step;
  }
  // One step tensor per parameter, all the same one: ATen reads state_steps[i] for tensor i.
  const std::vector<at::Tensor> steps(params.size(), step);
  at::NoGradGuard no_grad;
  at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, {}, steps, hyper.lr, hyper.beta1, hyper.beta2, hyper.weight_decay,
                    hyper.eps, /*amsgrad=*/false, /*maximize=*/false);
}

}  // namespace strata::kernels
