// The fused AdamW update (adamw.h): step constants, layout checks, threading.
#include "adamw.h"

#include <cmath>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

namespace strata::kernels {

AdamwCoefficients adamw_coefficients(const ops::AdamwHyper& h) {
  const double t = static_cast<double>(h.step);
  AdamwCoefficients c;
  c.decay = static_cast<float>(h.weight_decay != 0 ? 1.0 - h.lr * h.weight_decay : 1.0);
  c.lerp_weight = static_cast<float>(1.0 - h.beta1);
  c.lerp_from_end = 1.0 - h.beta1 >= 0.5;
  c.beta2 = static_cast<float>(h.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  c.bias2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(h.beta2, t)));
  c.eps = static_cast<float>(h.eps);
  c.step = static_cast<float>(-h.lr / (1.0 - std::pow(h.beta1, t)));
  return c;
}

namespace {

void update_one(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
                const AdamwCoefficients& c, const AdamwRows& rows) {
  for (const at::Tensor* t : {&param, &grad, &exp_avg, &exp_avg_sq})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->numel() == param.numel(),
                "adamw_update.fused_cpu: parameter, gradient and moments must be fp32 with the parameter's ", param.numel(),
                " elements");
  // Contiguous views (copies where a tensor is strided), written back after.
  const at::Tensor p = param.contiguous(), m = exp_avg.contiguous(), v = exp_avg_sq.contiguous(), g = grad.contiguous();
  float *pp = p.mutable_data_ptr<float>(), *mp = m.mutable_data_ptr<float>(), *vp = v.mutable_data_ptr<float>();
  const float* gp = g.const_data_ptr<float>();
  at::parallel_for(0, param.numel(), 32768, [&](int64_t begin, int64_t end) {
    rows(pp + begin, gp + begin, mp + begin, vp + begin, end - begin, c);
  });
  at::NoGradGuard no_grad;
  if (!p.is_same(param)) param.copy_(p);
  if (!m.is_same(exp_avg)) exp_avg.copy_(m);
  if (!v.is_same(exp_avg_sq)) exp_avg_sq.copy_(v);
}

}  // namespace

void adamw_update_fused_cpu(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                            const ops::AdamwHyper& hyper) {
  const AdamwCoefficients c = adamw_coefficients(hyper);
  const AdamwRows rows = adamw_rows();
  for (size_t i = 0; i < params.size(); ++i) update_one(params[i], grads[i], exp_avgs[i], exp_avg_sqs[i], c, rows);
}

}  // namespace strata::kernels
