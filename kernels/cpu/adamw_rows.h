// The arithmetic of the fused AdamW update (adamw.h) over contiguous fp32 arrays: its constants,
// and the row function each compiled copy of adamw_math.cpp defines (namespace `generic` and, on
// x86-64, `avx2`); adamw_rows() is the copy this CPU runs (cpu_dispatch.cpp).
#pragma once

#include <cstdint>

namespace strata::kernels {

// The step's constants, computed in double and rounded to float once, as ATen does with the
// scalar arguments of the reference's calls.
struct AdamwCoefficients {
  float decay;          // 1 - lr wd
  float lerp_weight;    // 1 - beta1: m = lerp(m, g, lerp_weight)
  bool lerp_from_end;   // ATen's lerp: weight >= 0.5 computes g - (g - m)(1 - w)
  float beta2, one_minus_beta2;
  float bias2_sqrt;     // sqrt(1 - beta2^t)
  float eps;
  float step;           // -lr / (1 - beta1^t)
};

using AdamwRows = void (*)(float* p, const float* g, float* m, float* v, int64_t n, const AdamwCoefficients& c);
AdamwRows adamw_rows();
namespace generic {
void adamw_rows(float* p, const float* g, float* m, float* v, int64_t n, const AdamwCoefficients& c);
}
namespace avx2 {
void adamw_rows(float* p, const float* g, float* m, float* v, int64_t n, const AdamwCoefficients& c);
}

}  // namespace strata::kernels
