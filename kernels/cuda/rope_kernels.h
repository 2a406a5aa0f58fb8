// Launchers of the fused rotary-embedding kernels (rope_kernels.cu, nvcc, no libtorch headers),
// rotate-half layout, over rows (b, h, t) of D = 2 H' values: with c, s = cos, sin of the row's
// position rounded to x's type, as the reference's cos.to(x.dtype) rounds them,
//   out[i] = x[i] c[i] - x[i + H'] s[i],   out[i + H'] = x[i + H'] c[i] + x[i] s[i]   (i < H')
// and the gradient dx[i] = dy[i] c[i] + dy[i + H'] s[i], dx[i + H'] = dy[i + H'] c[i] - dy[i] s[i],
// each product and sum rounded to x's type as the reference's separate kernels round them (no
// fused multiply-add), so the results equal the reference's bit for bit.
// Each returns cudaGetLastError() as an int (0: launched). `stream` is a cudaStream_t.
#pragma once

#include <cstdint>

#include "activation_kernels.h"  // Storage

namespace strata::kernels::cuda {

// The strides of x's (or dy's) first three dimensions [B, H, T], in elements; the last dimension
// (2 half) is contiguous. out is contiguous [B, H, T, 2 half]. cos and sin: fp32, contiguous
// [T, half] (cs_batch_stride 0) or [B, 1, T, half] (cs_batch_stride T half).
struct RopeShape {
  int64_t batch, heads, tokens, half;
  int64_t stride_b, stride_h, stride_t;
  int64_t cs_batch_stride;
};

// backward: x is dy and out is dx (the rotation by the negative angle).
int rope(Storage type, bool backward, const void* x, const float* cos, const float* sin, void* out, const RopeShape& shape,
         void* stream);

}  // namespace strata::kernels::cuda
