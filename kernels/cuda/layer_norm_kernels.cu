// Fused LayerNorm on a GPU (layer_norm_kernels.h), fp32 arithmetic on fp32 x, weight and bias;
// the output, and so dy, may be stored in bf16 or half (autocast's dtype). Forward: one block of 256 threads takes a
// row, held in registers (rows up to 2048 wide; wider ones are read again per pass): its sum, the
// squared deviations (the two-pass variance, not E[x^2] - mean^2, which loses digits when the mean
// is large), the output. Backward: blocks take row groups (kBackwardBlocksPerSm per multiprocessor); each reads a
// row of x and dy once for the two row sums (one barrier pair) and dx, and sums dy n and dy over
// its rows per column in registers, written once into its group's partial dw and db (each thread
// owns its columns: no atomics). The first version added them into memory row by row: 77 us a
// call at 8192 x 768 on an H200, slower than ATen's two kernels (66 us).
//
// Rows of up to 1024 values go through warp_forward_kernel and warp_backward_kernel instead: a
// warp a row, 32 values a lane in registers, the row sums by warp shuffles alone (no block
// barrier). The block-a-row kernels took 26 us (forward) and 47 us (backward) a call at 8192 x 768
// on an H200 (1.8 ms of GPT-2's step for 25 calls each), about 2 and 1.6 TB/s: each thread held 3
// values of its row, and every row waited on four (forward) or two (backward) barriers. The warp
// kernels' speed is not measured yet (tests/gpu/layer_norm_cuda_test.cpp checks their results on
// the next lease).
#include "layer_norm_kernels.h"

#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include "block_reduce.cuh"
#include "storage.cuh"

namespace strata::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// Rows of up to kMaxCols x kThreads values (2048: GPT-2's 768, Llama-1B's 2048) are held in
// registers, kMaxCols per thread, and read from memory once; wider rows are read again per pass.
constexpr int kMaxCols = 8;

// Y: the output's storage (float; bf16 or half for an output in autocast's dtype, rounded once).
// B: the branch's storage (add_layer_norm): with `branch` non-null the normalised row is
// residual + branch (x is the residual), rounded once to fp32 as ATen's add, and written to
// `sum`; the later passes of a row wider than the registers read it back from there (each thread
// its own columns, so no barrier). With `branch` null, the norm of x.
template <bool kInRegisters, class Y, class B>
__global__ void forward_kernel(const float* x, const B* branch, float* sum_out, const float* w, const float* b, Y* y, float* mean_out,
                               float* rstd_out, int64_t rows, int64_t dim, float eps) {
  __shared__ float shared[kThreads / 32];
  const float inv_dim = 1.f / static_cast<float>(dim);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float* residual = x + row * dim;
    const B* br = branch ? branch + row * dim : nullptr;
    float* sr = branch ? sum_out + row * dim : nullptr;
    auto load = [&](int64_t j) {  // the row's value j, first read
      if (!br) return residual[j];
      const float v = __fadd_rn(residual[j], to_float(br[j]));  // never contracted into an FMA
      sr[j] = v;
      return v;
    };
    const float* xr = sr ? sr : residual;  // where later reads find the row
    Y* yr = y + row * dim;
    float v[kInRegisters ? kMaxCols : 1];
    float sum = 0;
    if constexpr (kInRegisters) {
#pragma unroll
      for (int k = 0; k < kMaxCols; ++k) {
        const int64_t j = threadIdx.x + k * kThreads;
        v[k] = j < dim ? load(j) : 0.f;
        sum += v[k];
      }
    } else {
      for (int64_t j = threadIdx.x; j < dim; j += kThreads) sum += load(j);
    }
    const float mean = block_sum<kThreads>(sum, shared) * inv_dim;
    float squares = 0;
    if constexpr (kInRegisters) {
#pragma unroll
      for (int k = 0; k < kMaxCols; ++k)
        if (threadIdx.x + k * kThreads < dim) squares += (v[k] - mean) * (v[k] - mean);
    } else {
      for (int64_t j = threadIdx.x; j < dim; j += kThreads) squares += (xr[j] - mean) * (xr[j] - mean);
    }
    const float rstd = rsqrtf(block_sum<kThreads>(squares, shared) * inv_dim + eps);
    if (threadIdx.x == 0) mean_out[row] = mean, rstd_out[row] = rstd;
    if constexpr (kInRegisters) {
#pragma unroll
      for (int k = 0; k < kMaxCols; ++k) {
        const int64_t j = threadIdx.x + k * kThreads;
        if (j < dim) yr[j] = from_float<Y>((v[k] - mean) * rstd * w[j] + (b ? b[j] : 0.f));
      }
    } else {
      for (int64_t j = threadIdx.x; j < dim; j += kThreads) yr[j] = from_float<Y>((xr[j] - mean) * rstd * w[j] + (b ? b[j] : 0.f));
    }
  }
}

// Sum of v over the warp's lanes, returned to every lane.
__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

constexpr int kWarpRowMax = 1024;  // widest row warp_forward_kernel takes: 32 values a lane

// forward_kernel's arithmetic (the same add, the two-pass variance, the same output rounding) with
// a warp a row: lane l holds the row's values l, l + 32, ... in registers. 4 blocks (32 rows) a
// multiprocessor at once: __launch_bounds__ holds it to 64 registers a thread (96 unbounded), without spills.
template <class Y, class B>
__global__ void __launch_bounds__(kThreads, 4)
    warp_forward_kernel(const float* x, const B* branch, float* sum_out, const float* w, const float* b, Y* y, float* mean_out,
                        float* rstd_out, int64_t rows, int64_t dim, float eps) {
  constexpr int kPerLane = kWarpRowMax / 32;
  const float inv_dim = 1.f / static_cast<float>(dim);
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; row < rows; row += warps) {
    const int n = static_cast<int>(dim);
    const float* residual = x + row * dim;
    const B* br = branch ? branch + row * dim : nullptr;
    float* sr = branch ? sum_out + row * dim : nullptr;
    float v[kPerLane];
    float sum = 0;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int j = lane + 32 * k;  // dim <= kWarpRowMax: an int
      v[k] = 0.f;
      if (j < n) {
        v[k] = br ? __fadd_rn(residual[j], to_float(br[j])) : residual[j];  // never contracted into an FMA
        if (sr) sr[j] = v[k];
        sum += v[k];
      }
    }
    const float mean = warp_sum(sum) * inv_dim;
    float squares = 0;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k)
      if (lane + 32 * k < n) squares += (v[k] - mean) * (v[k] - mean);
    const float rstd = rsqrtf(warp_sum(squares) * inv_dim + eps);
    if (lane == 0) mean_out[row] = mean, rstd_out[row] = rstd;
    Y* yr = y + row * dim;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int j = lane + 32 * k;  // dim <= kWarpRowMax: an int
      if (j < n) yr[j] = from_float<Y>((v[k] - mean) * rstd * w[j] + (b ? b[j] : 0.f));
    }
  }
}

// With rows in registers, each thread also sums its columns' dw and db over the block's rows in
// registers and writes them once; otherwise it adds into the block's partial rows in memory.
// D: dy's storage (float; bf16 or half where the forward's output was in autocast's dtype).
// add_layer_norm: dx_plus (non-null) is added to dx (fp32, rounded once, as autograd's
// accumulation of the sum's two gradients), and dx_branch (non-null) gets that sum stored as B
// (the branch's gradient, which the add's backward would cast in a kernel of its own).
template <bool kInRegisters, class D, class B>
__global__ void __launch_bounds__(kThreads, kBackwardBlocksPerSm) backward_kernel(const float* x, const float* w, const float* mean_in, const float* rstd_in, const D* dy, float* dx,
                                const float* dx_plus, B* dx_branch, float* dw_partial, float* db_partial, int64_t rows, int64_t dim) {
  __shared__ float2 shared[kThreads / 32];
  const float inv_dim = 1.f / static_cast<float>(dim);
  float* dw = dw_partial + blockIdx.x * dim;  // this block's group
  float* db = db_partial ? db_partial + blockIdx.x * dim : nullptr;
  constexpr int kCols = kInRegisters ? kMaxCols : 1;
  float dw_sum[kCols] = {}, db_sum[kCols] = {};
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float* xr = x + row * dim;
    const D* dyr = dy + row * dim;
    float* dxr = dx + row * dim;
    const float* pr = dx_plus ? dx_plus + row * dim : nullptr;
    B* bgr = dx_branch ? dx_branch + row * dim : nullptr;
    auto store = [&](int64_t j, float d) {
      if (pr) d = __fadd_rn(d, pr[j]);  // never contracted into an FMA with the product before it
      dxr[j] = d;
      if (bgr) bgr[j] = from_float<B>(d);
    };
    const float mean = mean_in[row], rstd = rstd_in[row];
    float2 sums{0.f, 0.f};  // sum of g = dy w, sum of g n
    if constexpr (kInRegisters) {
      float n[kMaxCols], g[kMaxCols];
#pragma unroll
      for (int k = 0; k < kMaxCols; ++k) {
        const int64_t j = threadIdx.x + k * kThreads;
        n[k] = 0.f, g[k] = 0.f;
        if (j < dim) {
          const float d = to_float(dyr[j]);
          n[k] = (xr[j] - mean) * rstd, g[k] = d * w[j];
          dw_sum[k] += d * n[k], db_sum[k] += d;
          sums.x += g[k], sums.y += g[k] * n[k];
        }
      }
      const float2 total = block_sum2<kThreads>(sums, shared);
      const float g_mean = total.x * inv_dim, gn_mean = total.y * inv_dim;
#pragma unroll
      for (int k = 0; k < kMaxCols; ++k) {
        const int64_t j = threadIdx.x + k * kThreads;
        if (j < dim) store(j, rstd * (g[k] - g_mean - n[k] * gn_mean));
      }
    } else {
      for (int64_t j = threadIdx.x; j < dim; j += kThreads) {
        const float n = (xr[j] - mean) * rstd, d = to_float(dyr[j]), g = d * w[j];
        sums.x += g, sums.y += g * n;
        dw[j] += d * n;
        if (db) db[j] += d;
      }
      const float2 total = block_sum2<kThreads>(sums, shared);
      const float g_mean = total.x * inv_dim, gn_mean = total.y * inv_dim;
      for (int64_t j = threadIdx.x; j < dim; j += kThreads) {
        const float n = (xr[j] - mean) * rstd;
        store(j, rstd * (to_float(dyr[j]) * w[j] - g_mean - n * gn_mean));
      }
    }
  }
  if constexpr (kInRegisters) {
#pragma unroll
    for (int k = 0; k < kMaxCols; ++k) {
      const int64_t j = threadIdx.x + k * kThreads;
      if (j < dim) {
        dw[j] = dw_sum[k];
        if (db) db[j] = db_sum[k];
      }
    }
  }
}

// backward_kernel's arithmetic with a warp a row, for rows up to kWarpRowMax: lane l keeps the
// row's x and dy at l, l + 32, ... in registers for the two passes, the row sums are warp
// shuffles (no block barrier), and each warp adds its rows' dy n and dy into its own rows of
// shared memory (the lane's own columns: no atomics, no barrier). A block of kWarpBlockWarps
// warps sums its warps' rows once at the end into its group's partial dw and db: the same
// partials, one row per block, as backward_kernel's.
constexpr int kWarpBlockWarps = 4;

template <class D, class B>
__global__ void __launch_bounds__(kWarpBlockWarps * 32, kBackwardBlocksPerSm)
    warp_backward_kernel(const float* x, const float* w, const float* mean_in, const float* rstd_in, const D* dy, float* dx,
                         const float* dx_plus, B* dx_branch, float* dw_partial, float* db_partial, int64_t rows, int64_t dim) {
  constexpr int kPerLane = kWarpRowMax / 32;
  __shared__ float dw_rows[kWarpBlockWarps][kWarpRowMax], db_rows[kWarpBlockWarps][kWarpRowMax];
  const int n = static_cast<int>(dim);  // dim <= kWarpRowMax
  const float inv_dim = 1.f / static_cast<float>(dim);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k)
    if (lane + 32 * k < n) dw_rows[warp][lane + 32 * k] = 0.f, db_rows[warp][lane + 32 * k] = 0.f;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpBlockWarps;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpBlockWarps + warp; row < rows; row += warps) {
    const float* xr = x + row * dim;
    const D* dyr = dy + row * dim;
    const float mean = mean_in[row], rstd = rstd_in[row];
    float xn[kPerLane], d[kPerLane];  // x's normalised values, then dy
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int j = lane + 32 * k;
      xn[k] = j < n ? xr[j] : 0.f;
      d[k] = j < n ? to_float(dyr[j]) : 0.f;
    }
    float2 sums{0.f, 0.f};  // sum of g = dy w, sum of g n
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int j = lane + 32 * k;
      if (j >= n) continue;
      xn[k] = (xn[k] - mean) * rstd;
      const float g = d[k] * w[j];
      dw_rows[warp][j] += d[k] * xn[k], db_rows[warp][j] += d[k];
      sums.x += g, sums.y += g * xn[k];
    }
    const float g_mean = warp_sum(sums.x) * inv_dim, gn_mean = warp_sum(sums.y) * inv_dim;
    float* dxr = dx + row * dim;
    const float* pr = dx_plus ? dx_plus + row * dim : nullptr;
    B* bgr = dx_branch ? dx_branch + row * dim : nullptr;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int j = lane + 32 * k;
      if (j >= n) continue;
      float v = rstd * (d[k] * w[j] - g_mean - xn[k] * gn_mean);
      if (pr) v = __fadd_rn(v, pr[j]);  // never contracted into an FMA with the product before it
      dxr[j] = v;
      if (bgr) bgr[j] = from_float<B>(v);
    }
  }
  __syncthreads();  // every warp's rows summed into its shared rows
  float* dw = dw_partial + blockIdx.x * dim;
  float* db = db_partial ? db_partial + blockIdx.x * dim : nullptr;
  for (int j = threadIdx.x; j < n; j += kWarpBlockWarps * 32) {
    float dw_sum = 0.f, db_sum = 0.f;
#pragma unroll
    for (int v = 0; v < kWarpBlockWarps; ++v) dw_sum += dw_rows[v][j], db_sum += db_rows[v][j];
    dw[j] = dw_sum;
    if (db) db[j] = db_sum;
  }
}

// Calls f with a null pointer of the storage's type.
template <class F>
void with_storage(Storage type, F f) {
  switch (type) {
    case Storage::Float: return f(static_cast<float*>(nullptr));
    case Storage::BFloat16: return f(static_cast<__nv_bfloat16*>(nullptr));
    case Storage::Half: return f(static_cast<__half*>(nullptr));
  }
}

}  // namespace

int layer_norm_forward(const float* x, const void* branch, Storage branch_type, float* sum, const float* weight, const float* bias,
                       void* y, Storage y_type, float* mean, float* rstd, int64_t rows, int64_t dim, double eps, void* stream) {
  if (rows == 0 || dim == 0) return 0;
  const unsigned blocks = static_cast<unsigned>(rows < 65536 ? rows : 65536);
  const auto s = static_cast<cudaStream_t>(stream);
  with_storage(y_type, [&](auto* yt) {
    using Y = std::remove_pointer_t<decltype(yt)>;
    with_storage(branch ? branch_type : Storage::Float, [&](auto* bt) {
      using B = std::remove_pointer_t<decltype(bt)>;
      const B* br = static_cast<const B*>(branch);
      if (dim <= kWarpRowMax) {
        const int64_t row_blocks = (rows + kThreads / 32 - 1) / (kThreads / 32);
        warp_forward_kernel<Y, B><<<static_cast<unsigned>(row_blocks < 65536 ? row_blocks : 65536), kThreads, 0, s>>>(
            x, br, sum, weight, bias, static_cast<Y*>(y), mean, rstd, rows, dim, static_cast<float>(eps));
      } else if (dim <= kMaxCols * kThreads)
        forward_kernel<true, Y, B><<<blocks, kThreads, 0, s>>>(x, br, sum, weight, bias, static_cast<Y*>(y), mean, rstd, rows, dim,
                                                               static_cast<float>(eps));
      else
        forward_kernel<false, Y, B><<<blocks, kThreads, 0, s>>>(x, br, sum, weight, bias, static_cast<Y*>(y), mean, rstd, rows, dim,
                                                                static_cast<float>(eps));
    });
  });
  return static_cast<int>(cudaGetLastError());
}

int64_t layer_norm_backward_groups(int64_t rows) { return backward_row_groups(rows); }

int layer_norm_backward(const float* x, const float* weight, const float* mean, const float* rstd, const void* dy, Storage dy_type,
                        float* dx, const float* dx_plus, void* dx_branch, Storage branch_type, float* dweight_partial,
                        float* dbias_partial, int64_t rows, int64_t dim, void* stream) {
  if (rows == 0 || dim == 0) return 0;
  const auto blocks = static_cast<unsigned>(layer_norm_backward_groups(rows));
  const auto s = static_cast<cudaStream_t>(stream);
  with_storage(dy_type, [&](auto* dt) {
    using D = std::remove_pointer_t<decltype(dt)>;
    const D* d = static_cast<const D*>(dy);
    with_storage(dx_branch ? branch_type : Storage::Float, [&](auto* bt) {
      using B = std::remove_pointer_t<decltype(bt)>;
      B* bg = static_cast<B*>(dx_branch);
      if (dim <= kWarpRowMax)
        warp_backward_kernel<D, B><<<blocks, kWarpBlockWarps * 32, 0, s>>>(x, weight, mean, rstd, d, dx, dx_plus, bg, dweight_partial,
                                                                         dbias_partial, rows, dim);
      else if (dim <= kMaxCols * kThreads)
        backward_kernel<true, D, B><<<blocks, kThreads, 0, s>>>(x, weight, mean, rstd, d, dx, dx_plus, bg, dweight_partial, dbias_partial,
                                                                rows, dim);
      else
        backward_kernel<false, D, B><<<blocks, kThreads, 0, s>>>(x, weight, mean, rstd, d, dx, dx_plus, bg, dweight_partial, dbias_partial,
                                                                 rows, dim);
    });
  });
  return static_cast<int>(cudaGetLastError());
}

}  // namespace strata::kernels::cuda
