// The arithmetic of adamw.h over contiguous fp32 arrays, compiled once per CPU capability
// (STRATA_CPU_NAMESPACE: generic, avx2; kernels/CMakeLists.txt). The reference's operations in its
// order, each rounded to float as its ATen call rounds:
//   p = p decay;  m = m + w (g - m)  (or g - (g - m)(1 - w), as ATen's lerp for w >= 0.5);
//   v = v beta2 + (1 - beta2) g g;  p = p + step (m / (sqrt(v) / bias2_sqrt + eps)).
// One line, written once for vectors and scalars (the tail shorter than a vector).
#include <cmath>

#include <ATen/cpu/vec/vec.h>

#include "adamw_rows.h"

#ifndef STRATA_CPU_NAMESPACE
#error "compile adamw_math.cpp with STRATA_CPU_NAMESPACE set (kernels/CMakeLists.txt)"
#endif

namespace strata::kernels::STRATA_CPU_NAMESPACE {
namespace {

using Vec = at::vec::Vectorized<float>;

Vec root(const Vec& x) { return x.sqrt(); }
float root(float x) { return std::sqrt(x); }

template <class V>
void update(V& p, const V& g, V& m, V& v, const AdamwCoefficients& c) {
  p = p * V(c.decay);
  m = c.lerp_from_end ? g - (g - m) * V(1.0f - c.lerp_weight) : m + V(c.lerp_weight) * (g - m);
  v = v * V(c.beta2) + V(c.one_minus_beta2) * g * g;
  p = p + V(c.step) * (m / (root(v) / V(c.bias2_sqrt) + V(c.eps)));
}

}  // namespace

void adamw_rows(float* p, const float* g, float* m, float* v, int64_t n, const AdamwCoefficients& c) {
  constexpr int64_t w = Vec::size();
  int64_t i = 0;
  for (; i + w <= n; i += w) {
    Vec pv = Vec::loadu(p + i), mv = Vec::loadu(m + i), vv = Vec::loadu(v + i);
    update(pv, Vec::loadu(g + i), mv, vv, c);
    pv.store(p + i);
    mv.store(m + i);
    vv.store(v + i);
  }
  for (; i < n; ++i) update(p[i], g[i], m[i], v[i], c);
}

}  // namespace strata::kernels::STRATA_CPU_NAMESPACE
