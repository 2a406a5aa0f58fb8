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
// 16-bit type with fp32 T and W). B: the branch's storage (add_rms_norm): with `branch` non-null
// the normalised row is round_T(x + branch) (x is the residual), as ATen's add rounds it, written
// to `sum`, from where the second pass reads it back (each thread its own columns: no barrier).
template <class T, class W, class O, class B>
__global__ void forward_kernel(const T* x, const B* branch, T* sum_out, const W* w, O* y, float* rstd, int64_t rows, int64_t dim,
                               float eps) {
  __shared__ float shared[kThreads / 32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const B* br = branch ? branch + row * dim : nullptr;
    T* sr = branch ? sum_out + row * dim : nullptr;
    const T* xr = sr ? sr : x + row * dim;
    float squares = 0;
    for (int64_t j = threadIdx.x; j < dim; j += kThreads) {
      float v;
      if (br) {
        const T s = from_float<T>(__fadd_rn(to_float(x[row * dim + j]), to_float(br[j])));  // never contracted into an FMA
        sr[j] = s;
        v = to_float(s);
      } else {
        v = to_float(xr[j]);
      }
      squares += v * v;
    }
    const float r = rsqrtf(block_sum<kThreads>(squares, shared) / static_cast<float>(dim) + eps);
    if (threadIdx.x == 0) rstd[row] = r;
    O* yr = y + row * dim;
    for (int64_t j = threadIdx.x; j < dim; j += kThreads) yr[j] = from_float<O>(to_float(w[j]) * round_to<T>(to_float(xr[j]) * r));
  }
}

// add_rms_norm: dx_plus (non-null) is added to dx, rounded to T after each of the two steps as
// autograd's accumulation rounds; dx_branch (non-null) gets that sum stored as B.
template <class T, class W, class O, class B>
__global__ void __launch_bounds__(kThreads, kBackwardBlocksPerSm) backward_kernel(const T* x, const W* w, const float* rstd, const O* dy, T* dx, const T* dx_plus, B* dx_branch,
                                float* dw_partial, int64_t rows, int64_t dim) {
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
      T d = from_float<T>(r * round_to<T>(to_float(dyr[j]) * to_float(w[j])) - correction * xv);
      if (dx_plus) d = from_float<T>(__fadd_rn(to_float(d), to_float(dx_plus[row * dim + j])));
      dxr[j] = d;
      if (dx_branch) dx_branch[row * dim + j] = from_float<B>(to_float(d));
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

// Calls f with a null pointer of the branch's storage type: T, or (T float) bf16/half.
template <class T, class F>
void with_branch(Storage branch_type, F f) {
  if constexpr (std::is_same_v<T, float>) {
    if (branch_type == Storage::BFloat16) return f(static_cast<__nv_bfloat16*>(nullptr));
    if (branch_type == Storage::Half) return f(static_cast<__half*>(nullptr));
  }
  return f(static_cast<T*>(nullptr));
}

}  // namespace

int rms_norm_forward(Storage x_type, Storage weight_type, Storage out_type, const void* x, const void* branch, Storage branch_type,
                     void* sum, const void* weight, void* y, float* rstd, int64_t rows, int64_t dim, double eps, void* stream) {
  if (rows == 0 || dim == 0) return 0;
  with_types(x_type, weight_type, out_type, [&](auto* t, auto* wt, auto* ot) {
    using T = std::remove_pointer_t<decltype(t)>;
    using W = std::remove_pointer_t<decltype(wt)>;
    using O = std::remove_pointer_t<decltype(ot)>;
    with_branch<T>(branch ? branch_type : x_type, [&](auto* bt) {
      using B = std::remove_pointer_t<decltype(bt)>;
      forward_kernel<T, W, O, B><<<forward_blocks(rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
          static_cast<const T*>(x), static_cast<const B*>(branch), static_cast<T*>(sum), static_cast<const W*>(weight), static_cast<O*>(y),
          rstd, rows, dim, static_cast<float>(eps));
    });
  });
  return static_cast<int>(cudaGetLastError());
}

int64_t rms_norm_backward_groups(int64_t rows) { return backward_row_groups(rows); }

int rms_norm_backward(Storage x_type, Storage weight_type, Storage out_type, const void* x, const void* weight, const float* rstd,
                      const void* dy, void* dx, const void* dx_plus, void* dx_branch, Storage branch_type, float* dweight_partial,
                      int64_t rows, int64_t dim, void* stream) {
  if (rows == 0 || dim == 0) return 0;
  with_types(x_type, weight_type, out_type, [&](auto* t, auto* wt, auto* ot) {
    using T = std::remove_pointer_t<decltype(t)>;
    using W = std::remove_pointer_t<decltype(wt)>;
    using O = std::remove_pointer_t<decltype(ot)>;
    with_branch<T>(dx_branch ? branch_type : x_type, [&](auto* bt) {
      using B = std::remove_pointer_t<decltype(bt)>;
      backward_kernel<T, W, O, B><<<static_cast<unsigned>(rms_norm_backward_groups(rows)), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
          static_cast<const T*>(x), static_cast<const W*>(weight), rstd, static_cast<const O*>(dy), static_cast<T*>(dx),
          static_cast<const T*>(dx_plus), static_cast<B*>(dx_branch), dweight_partial, rows, dim);
    });
  });
  return static_cast<int>(cudaGetLastError());
}

}  // namespace strata::kernels::cuda
