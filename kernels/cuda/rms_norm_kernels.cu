// Fused RMSNorm on a GPU (rms_norm_kernels.h). The reference composes a dtype copy, a square, a
// mean, an rsqrt, two products and a cast forward, and saves fp32 temporaries of the whole
// activation for the backward; here one block of 256 threads takes a row: it reads the row once
// for the sum of squares and again (from L1/L2) to write the output, and the backward reads x,
// w and dy and writes dx, plus its share of dw into a per-block partial sum (rows are split into
// groups, one block each; the caller adds the groups). Only rstd (one float per row) is saved.
#include "rms_norm_kernels.h"

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "block_reduce.cuh"
#include "storage.cuh"

namespace strata::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// T: x's storage, W: the weight's (T or float), O: the output's (float if W is, else T; or a
// 16-bit type with fp32 T and W).
template <class T, class W, class O>
__global__ void forward_kernel(const T* x, const W* w, O* y, float* rstd, int64_t rows, int64_t dim, float eps) {
  __shared__ float shared[kThreads / 32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * dim;
    float squares = 0;
    for (int64_t j = threadIdx.x; j < dim; j += kThreads) {
      const float v = to_float(xr[j]);
      squares += v * v;
    }
    const float r = rsqrtf(block_sum<kThreads>(squares, shared) / static_cast<float>(dim) + eps);
    if (threadIdx.x == 0) rstd[row] = r;
    O* yr = y + row * dim;
    for (int64_t j = threadIdx.x; j < dim; j += kThreads) yr[j] = from_float<O>(to_float(w[j]) * round_to<T>(to_float(xr[j]) * r));
  }
}

template <class T, class W, class O>
__global__ void backward_kernel(const T* x, const W* w, const float* rstd, const O* dy, T* dx, float* dw_partial, int64_t rows,
                                int64_t dim) {
  __shared__ float shared[kThreads / 32];
  float* partial = dw_partial + blockIdx.x * dim;  // this block's group, zeroed by the caller
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * dim;
    const O* dyr = dy + row * dim;
    const float r = rstd[row];
    float gx = 0;
    for (int64_t j = threadIdx.x; j < dim; j += kThreads) {
      const float xv = to_float(xr[j]), d = to_float(dyr[j]);
      gx += round_to<T>(d * to_float(w[j])) * xv;
      partial[j] += d * round_to<T>(xv * r);
    }
    const float correction = r * r * r * block_sum<kThreads>(gx, shared) / static_cast<float>(dim);
    T* dxr = dx + row * dim;
    for (int64_t j = threadIdx.x; j < dim; j += kThreads) {
      const float xv = to_float(xr[j]);
      dxr[j] = from_float<T>(r * round_to<T>(to_float(dyr[j]) * to_float(w[j])) - correction * xv);
    }
  }
}

unsigned forward_blocks(int64_t rows) { return static_cast<unsigned>(rows < 65536 ? (rows < 1 ? 1 : rows) : 65536); }

// Calls f with null pointers of x's, the weight's and the output's storage types. The output is
// fp32 with an fp32 weight, else x's type (ATen's promotion), or with fp32 x and weight a 16-bit
// out_type (rms_norm.autocast_out_cuda: autocast's dtype, rounded once).
template <class F>
void with_types(Storage x_type, Storage weight_type, Storage out_type, F f) {
  const bool float_weight = weight_type == Storage::Float;
  switch (x_type) {
    case Storage::Float:
      if (out_type == Storage::BFloat16) return f(static_cast<float*>(nullptr), static_cast<float*>(nullptr), static_cast<__nv_bfloat16*>(nullptr));
      if (out_type == Storage::Half) return f(static_cast<float*>(nullptr), static_cast<float*>(nullptr), static_cast<__half*>(nullptr));
      return f(static_cast<float*>(nullptr), static_cast<float*>(nullptr), static_cast<float*>(nullptr));
    case Storage::BFloat16:
      if (float_weight) return f(static_cast<__nv_bfloat16*>(nullptr), static_cast<float*>(nullptr), static_cast<float*>(nullptr));
      return f(static_cast<__nv_bfloat16*>(nullptr), static_cast<__nv_bfloat16*>(nullptr), static_cast<__nv_bfloat16*>(nullptr));
    case Storage::Half:
      if (float_weight) return f(static_cast<__half*>(nullptr), static_cast<float*>(nullptr), static_cast<float*>(nullptr));
      return f(static_cast<__half*>(nullptr), static_cast<__half*>(nullptr), static_cast<__half*>(nullptr));
  }
}

}  // namespace

int rms_norm_forward(Storage x_type, Storage weight_type, Storage out_type, const void* x, const void* weight, void* y, float* rstd,
                     int64_t rows, int64_t dim, double eps, void* stream) {
  if (rows == 0 || dim == 0) return 0;
  with_types(x_type, weight_type, out_type, [&](auto* t, auto* wt, auto* ot) {
    using T = std::remove_pointer_t<decltype(t)>;
    using W = std::remove_pointer_t<decltype(wt)>;
    using O = std::remove_pointer_t<decltype(ot)>;
    forward_kernel<T, W, O><<<forward_blocks(rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(x), static_cast<const W*>(weight), static_cast<O*>(y), rstd, rows, dim, static_cast<float>(eps));
  });
  return static_cast<int>(cudaGetLastError());
}

int64_t rms_norm_backward_groups(int64_t rows) {
  const int64_t groups = 2 * static_cast<int64_t>(sm_count());
  return rows < groups ? (rows < 1 ? 1 : rows) : groups;
}

int rms_norm_backward(Storage x_type, Storage weight_type, Storage out_type, const void* x, const void* weight, const float* rstd,
                      const void* dy, void* dx, float* dweight_partial, int64_t rows, int64_t dim, void* stream) {
  if (rows == 0 || dim == 0) return 0;
  with_types(x_type, weight_type, out_type, [&](auto* t, auto* wt, auto* ot) {
    using T = std::remove_pointer_t<decltype(t)>;
    using W = std::remove_pointer_t<decltype(wt)>;
    using O = std::remove_pointer_t<decltype(ot)>;
    backward_kernel<T, W, O><<<static_cast<unsigned>(rms_norm_backward_groups(rows)), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(x), static_cast<const W*>(weight), rstd, static_cast<const O*>(dy), static_cast<T*>(dx), dweight_partial,
        rows, dim);
  });
  return static_cast<int>(cudaGetLastError());
}

}  // namespace strata::kernels::cuda
