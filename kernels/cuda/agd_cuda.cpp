// agd_cuda.h: the step's constants in double, rounded to float (as the CPU kernel in
// plugins/agd does), then one launch on the current stream over contiguous views.
#include "cuda/agd_cuda.h"

#include <cmath>
#include <limits>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cuda/agd_kernels.h"

namespace strata::kernels {
namespace {

cuda::AgdConstants constants_of(const ops::AgdHyper& h) {
  const double t = static_cast<double>(h.step);
  const double c1 = 1.0 - std::pow(h.beta1, t), c1_prev = 1.0 - std::pow(h.beta1, t - 1), c2 = 1.0 - std::pow(h.beta2, t);
  const bool decays = !h.win && h.weight_decay != 0;
  const double a = h.lr * std::sqrt(c2) / c1, tau = 1.0 / (3.0 + 2.0 * a * h.weight_decay);
  cuda::AgdConstants c{};
  c.decay = static_cast<float>(decays && h.weight_decouple ? 1.0 - (h.fixed_decay ? 1.0 : h.lr) * h.weight_decay : 1.0);
  c.coupled_decay = static_cast<float>(decays && !h.weight_decouple ? h.weight_decay : 0.0);
  c.beta1 = static_cast<float>(h.beta1), c.one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
  c.beta2 = static_cast<float>(h.beta2), c.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  c.inv_c1 = static_cast<float>(1.0 / c1);
  c.inv_c1_prev = static_cast<float>(h.step <= 1 ? 0.0 : 1.0 / c1_prev);  // m_prev is zero at t = 1
  c.floor = static_cast<float>(h.delta * std::sqrt(c2));
  c.clip = h.clip > 0 ? static_cast<float>(h.clip) : std::numeric_limits<float>::infinity();
  c.a = static_cast<float>(a);
  c.z_divisor = static_cast<float>(1.0 + h.weight_decay * a);
  c.tau = static_cast<float>(tau), c.two_tau_a = static_cast<float>(2.0 * tau * a), c.two_tau = static_cast<float>(2.0 * tau);
  c.amsgrad = h.amsgrad, c.win = h.win;
  return c;
}

}  // namespace

void agd_update_fused_cuda(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                           const at::Tensor& exp_avg_diff_sq, const at::Tensor& max_exp_avg_diff_sq, const at::Tensor& z,
                           const ops::AgdHyper& hyper) {
  const std::vector<at::Tensor> originals{param, exp_avg, exp_avg_diff_sq, max_exp_avg_diff_sq, z};
  for (const at::Tensor& t : {param, grad, exp_avg, exp_avg_diff_sq})
    TORCH_CHECK(t.is_cuda() && t.scalar_type() == at::kFloat && t.numel() == param.numel() && t.device() == param.device(),
                "agd_update.fused_cuda: parameter, gradient and state must be fp32 CUDA tensors of the parameter's size");
  TORCH_CHECK(!hyper.amsgrad || max_exp_avg_diff_sq.defined(), "agd_update.fused_cuda: amsgrad needs max_exp_avg_diff_sq");
  TORCH_CHECK(!hyper.win || z.defined(), "agd_update.fused_cuda: win needs z");
  // Contiguous views (copies where a tensor is strided), written back after.
  std::vector<at::Tensor> work;
  for (const auto& t : originals) work.push_back(t.defined() ? t.contiguous() : t);
  const at::Tensor g = grad.contiguous();
  auto ptr = [](const at::Tensor& t) { return t.defined() ? t.mutable_data_ptr<float>() : nullptr; };
  const c10::cuda::CUDAGuard guard(param.device());
  const int error = cuda::agd_update(ptr(work[0]), g.const_data_ptr<float>(), ptr(work[1]), ptr(work[2]),
                                     hyper.amsgrad ? ptr(work[3]) : nullptr, hyper.win ? ptr(work[4]) : nullptr, param.numel(),
                                     constants_of(hyper), static_cast<void*>(c10::cuda::getCurrentCUDAStream().stream()));
  TORCH_CHECK(error == 0, "agd_update.fused_cuda: CUDA kernel launch failed (cudaError ", error, ")");
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < originals.size(); ++i)
    if (originals[i].defined() && !originals[i].is_same(work[i])) originals[i].copy_(work[i]);
}

}  // namespace strata::kernels
