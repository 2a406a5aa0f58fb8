// Launcher of the fused AGD update on a GPU (agd_kernels.cu, compiled by nvcc without libtorch's
// headers): one grid-stride pass over a parameter's contiguous fp32 arrays, each element's
// parameter, gradient and state read once and written once, where core's agd_update.reference
// runs about fifteen ATen kernels. The step's constants are the CPU kernel's
// (cpu/agd_coefficients.h), so the arithmetic is the reference's operation for operation in fp32.
#pragma once

#include <cstdint>

#include "cpu/agd_coefficients.h"

namespace strata::kernels::cuda {

// p, g, m (exp_avg), b (exp_avg_diff_sq) always; b_max with amsgrad, z with win (else null).
// `stream` is a cudaStream_t. Returns cudaGetLastError() as an int (0: launched).
int agd_update(float* p, const float* g, float* m, float* b, float* b_max, float* z, int64_t n, const AgdCoefficients<float>& c,
               bool amsgrad, bool win, void* stream);

}  // namespace strata::kernels::cuda
