// Fused rotary embedding (rope_kernels.h): one thread per pair (i, i + half) of a row, a
// grid-stride loop over B H T half pairs. The reference (an ATen composition: two narrows, four
// products, a difference, a sum and a cat forward; as many kernels again backward, with
// zero-filled gradients for the narrows) reads and writes the activation about ten times; this
// reads it once and writes it once each way. __fmul_rn / __fadd_rn keep nvcc from contracting a
// product and a sum into one rounding, which the reference's separate kernels do not have.
#include "rope_kernels.h"

#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include "storage.cuh"

namespace strata::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// a b rounded to T: what ATen's mul of two T tensors stores.
template <class T>
__device__ __forceinline__ float product(float a, float b) {
  return round_to<T>(__fmul_rn(a, b));
}

template <class T, bool kBackward>
__global__ void rope_kernel(const T* x, const float* cos, const float* sin, T* out, RopeShape s) {
  const int64_t pairs = s.batch * s.heads * s.tokens * s.half;
  for (int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; n < pairs;
       n += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = n % s.half, row = n / s.half;
    const int64_t t = row % s.tokens, h = (row / s.tokens) % s.heads, b = row / (s.tokens * s.heads);
    const T* xr = x + b * s.stride_b + h * s.stride_h + t * s.stride_t;
    T* outr = out + row * 2 * s.half;
    const int64_t cs = b * s.cs_batch_stride + t * s.half + i;
    const float c = round_to<T>(cos[cs]), sn = round_to<T>(sin[cs]);
    const float lo = to_float(xr[i]), hi = to_float(xr[i + s.half]);
    if constexpr (!kBackward) {
      outr[i] = from_float<T>(__fsub_rn(product<T>(lo, c), product<T>(hi, sn)));
      outr[i + s.half] = from_float<T>(__fadd_rn(product<T>(hi, c), product<T>(lo, sn)));
    } else {  // lo, hi: dy's halves
      outr[i] = from_float<T>(__fadd_rn(product<T>(lo, c), product<T>(hi, sn)));
      outr[i + s.half] = from_float<T>(__fsub_rn(product<T>(hi, c), product<T>(lo, sn)));
    }
  }
}

template <class T>
void launch(bool backward, const void* x, const float* cos, const float* sin, void* out, const RopeShape& shape, cudaStream_t stream) {
  const int64_t pairs = shape.batch * shape.heads * shape.tokens * shape.half;
  const int64_t wanted = (pairs + kThreads - 1) / kThreads;
  const auto blocks = static_cast<unsigned>(wanted < 65536 ? wanted : 65536);
  const T* in = static_cast<const T*>(x);
  T* o = static_cast<T*>(out);
  if (backward)
    rope_kernel<T, true><<<blocks, kThreads, 0, stream>>>(in, cos, sin, o, shape);
  else
    rope_kernel<T, false><<<blocks, kThreads, 0, stream>>>(in, cos, sin, o, shape);
}

}  // namespace

int rope(Storage type, bool backward, const void* x, const float* cos, const float* sin, void* out, const RopeShape& shape,
         void* stream) {
  if (shape.batch * shape.heads * shape.tokens * shape.half == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (type) {
    case Storage::Float: launch<float>(backward, x, cos, sin, out, shape, s); break;
    case Storage::BFloat16: launch<__nv_bfloat16>(backward, x, cos, sin, out, shape, s); break;
    case Storage::Half: launch<__half>(backward, x, cos, sin, out, shape, s); break;
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace strata::kernels::cuda
