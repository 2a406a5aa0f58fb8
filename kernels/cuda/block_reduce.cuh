// Sums across a thread block for Strata's row kernels (a block of kThreads threads takes a row:
// rms_norm_kernels.cu, layer_norm_kernels.cu), and the device's multiprocessor count their
// backward kernels size their row groups by.
#pragma once

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

}  // namespace strata::kernels::cuda
