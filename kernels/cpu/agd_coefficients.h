// The constants of one AGD step (docs/optimizers.md has the rule), shared by the CPU kernel
// (plugins/agd/agd_fused_cpu.cpp) and the CUDA kernel (kernels/cuda/agd_kernels.cu): computed once
// in double and rounded to the element type, as ATen rounds scalar arguments, with the options
// folded in so that the per-element arithmetic has no branches and stays exact (no coupled decay:
// it adds 0 x p; no clip: it clamps to +-inf). Per element, in this order:
//   g' = g + coupled_decay p;  p' = p decay;  m' = beta1 m + (1 - beta1) g'
//   s = m' inv_c1 - m inv_c1_prev;  b' = beta2 b + (1 - beta2) s^2  (amsgrad: b_max' = max(b_max, b'))
//   u = clamp(m' / max(sqrt(b'), floor), -clip, clip)
//   plain: p'' = p' - a u;  win: z' = (z - a u) / z_divisor, p'' = tau p' - two_tau_a u + two_tau z'
// No libtorch header: nvcc compiles it; `Hyper` is ops::AgdHyper.
#pragma once

#include <cmath>
#include <limits>

namespace strata::kernels {

template <class T>
struct AgdCoefficients {
  T decay, coupled_decay, beta1, one_minus_beta1, beta2, one_minus_beta2, inv_c1, inv_c1_prev, floor, clip, a, z_divisor, tau,
      two_tau_a, two_tau;

  template <class Hyper>
  explicit AgdCoefficients(const Hyper& h) {
    const double t = static_cast<double>(h.step);
    const double c1 = 1.0 - std::pow(h.beta1, t), c1_prev = 1.0 - std::pow(h.beta1, t - 1), c2 = 1.0 - std::pow(h.beta2, t);
    const bool decays = !h.win && h.weight_decay != 0;
    decay = static_cast<T>(decays && h.weight_decouple ? 1.0 - (h.fixed_decay ? 1.0 : h.lr) * h.weight_decay : 1.0);
    coupled_decay = static_cast<T>(decays && !h.weight_decouple ? h.weight_decay : 0.0);
    beta1 = static_cast<T>(h.beta1);
    one_minus_beta1 = static_cast<T>(1.0 - h.beta1);
    beta2 = static_cast<T>(h.beta2);
    one_minus_beta2 = static_cast<T>(1.0 - h.beta2);
    inv_c1 = static_cast<T>(1.0 / c1);
    inv_c1_prev = static_cast<T>(h.step <= 1 ? 0.0 : 1.0 / c1_prev);  // m_prev is zero at t = 1
    floor = static_cast<T>(h.delta * std::sqrt(c2));
    clip = h.clip > 0 ? static_cast<T>(h.clip) : std::numeric_limits<T>::infinity();
    const double step_size = h.lr * std::sqrt(c2) / c1;
    a = static_cast<T>(step_size);
    z_divisor = static_cast<T>(1.0 + h.weight_decay * step_size);
    const double t_win = 1.0 / (3.0 + 2.0 * step_size * h.weight_decay);
    tau = static_cast<T>(t_win);
    two_tau_a = static_cast<T>(2.0 * t_win * step_size);
    two_tau = static_cast<T>(2.0 * t_win);
  }
};

}  // namespace strata::kernels
