// The fused AGD update on a GPU (agd_kernels.h): per element, in fp32, the formulas and order of
// cpu/agd_coefficients.h (the CPU kernel's loop, plugins/agd/agd_fused_cpu.cpp, on a GPU).
// Memory-bound: a grid-stride loop, one element per thread per iteration (the arrays are
// contiguous, so neighbouring threads read neighbouring floats); amsgrad and win are template
// arguments so the common case touches only four arrays.
#include "agd_kernels.h"

#include <cuda_runtime.h>

namespace strata::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 16;

template <bool Amsgrad, bool Win>
__global__ void agd_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m, float* __restrict__ b,
                           float* __restrict__ b_max, float* __restrict__ z, int64_t n, AgdCoefficients<float> c) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += stride) {
    float param = p[i];
    const float grad = g[i] + c.coupled_decay * param;
    param = param * c.decay;
    const float m_prev = m[i];
    const float m_new = m_prev * c.beta1 + c.one_minus_beta1 * grad;
    const float s = m_new * c.inv_c1 - m_prev * c.inv_c1_prev;
    const float b_new = b[i] * c.beta2 + c.one_minus_beta2 * (s * s);
    m[i] = m_new;
    b[i] = b_new;
    float b_used = b_new;
    if constexpr (Amsgrad) b_used = b_max[i] = fmaxf(b_max[i], b_new);
    const float u = fminf(fmaxf(m_new / fmaxf(sqrtf(b_used), c.floor), -c.clip), c.clip);
    if constexpr (Win) {
      const float z_new = (z[i] - c.a * u) / c.z_divisor;
      z[i] = z_new;
      p[i] = param * c.tau - c.two_tau_a * u + c.two_tau * z_new;
    } else {
      p[i] = param - c.a * u;
    }
  }
}

}  // namespace

int agd_update(float* p, const float* g, float* m, float* b, float* b_max, float* z, int64_t n, const AgdCoefficients<float>& c,
               bool amsgrad, bool win, void* stream) {
  if (n == 0) return 0;
  int64_t blocks = (n + kThreads - 1) / kThreads;
  blocks = blocks > kMaxBlocks ? kMaxBlocks : blocks;
  const auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(blocks));
  if (amsgrad)
    win ? agd_kernel<true, true><<<grid, kThreads, 0, s>>>(p, g, m, b, b_max, z, n, c)
          : agd_kernel<true, false><<<grid, kThreads, 0, s>>>(p, g, m, b, b_max, z, n, c);
  else
    win ? agd_kernel<false, true><<<grid, kThreads, 0, s>>>(p, g, m, b, b_max, z, n, c)
          : agd_kernel<false, false><<<grid, kThreads, 0, s>>>(p, g, m, b, b_max, z, n, c);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace strata::kernels::cuda
