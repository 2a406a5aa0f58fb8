// AGD's update in one pass over each tensor: every element's parameter, gradient and state are
// read once and written once, where the reference makes about fifteen passes. The arithmetic is
// the reference's, operation for operation, in the tensor's own precision.
#include "agd_fused_cpu.h"

#include "cpu/agd_coefficients.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>

namespace strata::agd {
namespace {

using kernels::AgdCoefficients;  // the step's constants, shared with the CUDA kernel

// Options that would otherwise branch per element are template arguments; the others are folded
// into the constants (agd_coefficients.h), so the loop body is branch-free and vectorises.
template <class T, bool Amsgrad, bool Win>
void update_range(T* __restrict p, const T* __restrict g, T* __restrict m, T* __restrict b, T* __restrict b_max,
                  T* __restrict z, int64_t begin, int64_t end, const AgdCoefficients<T>& c) {
  const T coupled_decay = c.coupled_decay, clip = c.clip;
  for (int64_t i = begin; i < end; ++i) {
    T param = p[i];
    const T grad = g[i] + coupled_decay * param;
    param = param * c.decay;
    const T m_prev = m[i];
    const T m_new = m_prev * c.beta1 + c.one_minus_beta1 * grad;
    const T s = m_new * c.inv_c1 - m_prev * c.inv_c1_prev;
    const T b_new = b[i] * c.beta2 + c.one_minus_beta2 * (s * s);
    m[i] = m_new;
    b[i] = b_new;
    T b_used = b_new;
    if constexpr (Amsgrad) b_used = b_max[i] = std::max(b_max[i], b_new);
    const T root = std::sqrt(b_used);
    const T u = std::min(std::max(m_new / std::max(root, c.floor), -clip), clip);
    if constexpr (Win) {
      const T z_new = (z[i] - c.a * u) / c.z_divisor;
      z[i] = z_new;
      p[i] = param * c.tau - c.two_tau_a * u + c.two_tau * z_new;
    } else {
      p[i] = param - c.a * u;
    }
  }
}

template <class T, bool Amsgrad, bool Win>
void update_all(T* p, const T* g, T* m, T* b, T* b_max, T* z, int64_t n, const AgdCoefficients<T>& c) {
  at::parallel_for(0, n, 32768, [&](int64_t begin, int64_t end) {
    update_range<T, Amsgrad, Win>(p, g, m, b, b_max, z, begin, end, c);
  });
}

template <class T>
void update(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& m, const at::Tensor& b, const at::Tensor& b_max,
            const at::Tensor& z, const ops::AgdHyper& hyper) {
  const AgdCoefficients<T> c(hyper);
  auto ptr = [](const at::Tensor& t) { return t.defined() ? t.data_ptr<T>() : nullptr; };
  T *p = ptr(param), *mp = ptr(m), *bp = ptr(b), *bmp = ptr(b_max), *zp = ptr(z);
  const T* gp = ptr(grad);
  const int64_t n = param.numel();
  if (hyper.amsgrad)
    hyper.win ? update_all<T, true, true>(p, gp, mp, bp, bmp, zp, n, c) : update_all<T, true, false>(p, gp, mp, bp, bmp, zp, n, c);
  else
    hyper.win ? update_all<T, false, true>(p, gp, mp, bp, bmp, zp, n, c) : update_all<T, false, false>(p, gp, mp, bp, bmp, zp, n, c);
}

}  // namespace

void agd_update_fused_cpu(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                          const at::Tensor& exp_avg_diff_sq, const at::Tensor& max_exp_avg_diff_sq, const at::Tensor& z,
                          const ops::AgdHyper& hyper) {
  // Works on contiguous views (copies where a tensor is strided) and writes copies back.
  std::vector<at::Tensor> originals{param, exp_avg, exp_avg_diff_sq, max_exp_avg_diff_sq, z};
  std::vector<at::Tensor> work;
  for (const auto& t : originals) work.push_back(t.defined() ? t.contiguous() : t);
  const at::Tensor g = grad.contiguous();
  if (param.scalar_type() == at::kDouble)
    update<double>(work[0], g, work[1], work[2], work[3], work[4], hyper);
  else
    update<float>(work[0], g, work[1], work[2], work[3], work[4], hyper);
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < originals.size(); ++i)
    if (originals[i].defined() && !originals[i].is_same(work[i])) originals[i].copy_(work[i]);
}

}  // namespace strata::agd
