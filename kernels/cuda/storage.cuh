// Float arithmetic on float, bfloat16 or half storage in Strata's CUDA kernels: loads widen to
// float, stores round to nearest even (CUDA's conversions, as ATen's).
#pragma once

#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace strata::kernels::cuda {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <class T>
__device__ __forceinline__ T from_float(float v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16(v);
  else return __float2half(v);
}

// v rounded to T's precision and back: what a cast to T and back to float gives.
template <class T>
__device__ __forceinline__ float round_to(float v) { return to_float(from_float<T>(v)); }

}  // namespace strata::kernels::cuda
