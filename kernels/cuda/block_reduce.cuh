// Sums across a thread block for Strata's row kernels (a block of kThreads threads takes a row:
// rms_norm_kernels.cu, layer_norm_kernels.cu), and the row groups their backward kernels split
// the rows into.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace strata::kernels::cuda {

// Sum of v over the block's threads, returned to every thread. `shared` holds kThreads / 32 floats.
template <int kThreads>
__device__ inline float block_sum(float v, float* shared) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // shared may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float total = 0;
  for (int w = 0; w < kThreads / 32; ++w) total += shared[w];
  return total;
}

// Two sums at once (one pair of barriers), returned to every thread. `shared` holds kThreads / 32 float2.
template <int kThreads>
__device__ inline float2 block_sum2(float2 v, float2* shared) {
  for (int offset = 16; offset > 0; offset /= 2) {
    v.x += __shfl_down_sync(0xffffffffu, v.x, offset);
    v.y += __shfl_down_sync(0xffffffffu, v.y, offset);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // shared may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float2 total{0.f, 0.f};
  for (int w = 0; w < kThreads / 32; ++w) total.x += shared[w].x, total.y += shared[w].y;
  return total;
}

// The current device's multiprocessors (at least 1).
inline int sm_count() {
  int device = 0, count = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
  return count > 0 ? count : 1;
}

// The norms' backward kernels give each block a group of rows and a partial dw (and db) row of
// its own, which the caller sums. Their rows are latency-bound (loads, a block-wide sum, stores),
// so more resident blocks hide more of it: kBackwardBlocksPerSm a multiprocessor, which each
// kernel's __launch_bounds__(threads, kBackwardBlocksPerSm) guarantees (at most 64 registers a
// thread for 256-thread blocks, 128 for the LayerNorm warp kernel's 128). At 2 a multiprocessor
// the LayerNorm backward took 47 us at 8192 x 768 on an H200, 1.6 TB/s; 4 is not measured yet.
constexpr int kBackwardBlocksPerSm = 4;

// One group per resident block, at most one per row (at least 1).
inline int64_t backward_row_groups(int64_t rows) {
  const int64_t groups = kBackwardBlocksPerSm * static_cast<int64_t>(sm_count());
  return rows < groups ? (rows < 1 ? 1 : rows) : groups;
}

}  // namespace strata::kernels::cuda
