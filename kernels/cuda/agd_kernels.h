// Launcher of the fused AGD update on a GPU (agd_kernels.cu, compiled by nvcc without libtorch's
// headers): one grid-stride pass over a parameter's contiguous fp32 arrays, each element's
// parameter, gradient and state read once and written once, where core's agd_update.reference
// runs about fifteen ATen kernels. The constants are the step's (AgdConstants, filled by
// agd_cuda.cpp from ops::AgdHyper in double and rounded to float, as ATen rounds scalar
// arguments), so the arithmetic is the reference's operation for operation in fp32.
#pragma once

#include <cstdint>

namespace strata::kernels::cuda {

struct AgdConstants {
  // decay: the decoupled factor 1 - (lr or 1) wd (1 when none); coupled_decay: wd added to the
  // gradient times the parameter (0 when decoupled or none); clip: +inf when off.
  float decay, coupled_decay, beta1, one_minus_beta1, beta2, one_minus_beta2, inv_c1, inv_c1_prev, floor, clip, a, z_divisor,
      tau, two_tau_a, two_tau;
  bool amsgrad, win;
};

// p, g, m (exp_avg), b (exp_avg_diff_sq) always; b_max with amsgrad, z with win (else null).
// `stream` is a cudaStream_t. Returns cudaGetLastError() as an int (0: launched).
int agd_update(float* p, const float* g, float* m, float* b, float* b_max, float* z, int64_t n, const AgdConstants& c,
               void* stream);

}  // namespace strata::kernels::cuda
