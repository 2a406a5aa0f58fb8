// Fused LayerNorm on a GPU (layer_norm_kernels.h), fp32. Forward: one block of 256 threads takes a
// row and reads it three times (sum, squared deviations, output; the second and third from L1/L2):
// the two-pass variance, not E[x^2] - mean^2, which loses digits when the mean is large. Backward:
// blocks take row groups (two per multiprocessor); each reads a row of x and dy once for the two
// row sums, again (from cache) to write dx, and adds dy n and dy into its group's partial dw and db
// (each thread owns its columns: no atomics).
#include "layer_norm_kernels.h"

#include <cstdint>

#include <cuda_runtime.h>

namespace strata::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// Sum of v over the block's threads, returned to every thread. `shared` holds kThreads / 32 floats.
__device__ float block_sum(float v, float* shared) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // shared may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float total = 0;
  for (int w = 0; w < kThreads / 32; ++w) total += shared[w];
  return total;
}

__global__ void forward_kernel(const float* x, const float* w, const float* b, float* y, float* mean_out, float* rstd_out, int64_t rows,
                               int64_t dim, float eps) {
  __shared__ float shared[kThreads / 32];
  const float inv_dim = 1.f / static_cast<float>(dim);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float* xr = x + row * dim;
    float sum = 0;
    for (int64_t j = threadIdx.x; j < dim; j += kThreads) sum += xr[j];
    const float mean = block_sum(sum, shared) * inv_dim;
    float squares = 0;
    for (int64_t j = threadIdx.x; j < dim; j += kThreads) {
      const float d = xr[j] - mean;
      squares += d * d;
    }
    const float rstd = rsqrtf(block_sum(squares, shared) * inv_dim + eps);
    if (threadIdx.x == 0) mean_out[row] = mean, rstd_out[row] = rstd;
    float* yr = y + row * dim;
    for (int64_t j = threadIdx.x; j < dim; j += kThreads) yr[j] = (xr[j] - mean) * rstd * w[j] + (b ? b[j] : 0.f);
  }
}

__global__ void backward_kernel(const float* x, const float* w, const float* mean_in, const float* rstd_in, const float* dy, float* dx,
                                float* dw_partial, float* db_partial, int64_t rows, int64_t dim) {
  __shared__ float shared[kThreads / 32];
  const float inv_dim = 1.f / static_cast<float>(dim);
  float* dw = dw_partial + blockIdx.x * dim;  // this block's group
  float* db = db_partial ? db_partial + blockIdx.x * dim : nullptr;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float* xr = x + row * dim;
    const float* dyr = dy + row * dim;
    const float mean = mean_in[row], rstd = rstd_in[row];
    float g_sum = 0, gn_sum = 0;
    for (int64_t j = threadIdx.x; j < dim; j += kThreads) {
      const float n = (xr[j] - mean) * rstd, d = dyr[j], g = d * w[j];
      g_sum += g;
      gn_sum += g * n;
      dw[j] += d * n;
      if (db) db[j] += d;
    }
    const float g_mean = block_sum(g_sum, shared) * inv_dim;
    const float gn_mean = block_sum(gn_sum, shared) * inv_dim;
    float* dxr = dx + row * dim;
    for (int64_t j = threadIdx.x; j < dim; j += kThreads) {
      const float n = (xr[j] - mean) * rstd;
      dxr[j] = rstd * (dyr[j] * w[j] - g_mean - n * gn_mean);
    }
  }
}

int sm_count() {
  int device = 0, count = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
  return count > 0 ? count : 1;
}

}  // namespace

int layer_norm_forward(const float* x, const float* weight, const float* bias, float* y, float* mean, float* rstd, int64_t rows,
                       int64_t dim, double eps, void* stream) {
  if (rows == 0 || dim == 0) return 0;
  const unsigned blocks = static_cast<unsigned>(rows < 65536 ? rows : 65536);
  forward_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, weight, bias, y, mean, rstd, rows, dim,
                                                                              static_cast<float>(eps));
  return static_cast<int>(cudaGetLastError());
}

int64_t layer_norm_backward_groups(int64_t rows) {
  const int64_t groups = 2 * static_cast<int64_t>(sm_count());
  return rows < groups ? (rows < 1 ? 1 : rows) : groups;
}

int layer_norm_backward(const float* x, const float* weight, const float* mean, const float* rstd, const float* dy, float* dx,
                        float* dweight_partial, float* dbias_partial, int64_t rows, int64_t dim, void* stream) {
  if (rows == 0 || dim == 0) return 0;
  backward_kernel<<<static_cast<unsigned>(layer_norm_backward_groups(rows)), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      x, weight, mean, rstd, dy, dx, dweight_partial, dbias_partial, rows, dim);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace strata::kernels::cuda
