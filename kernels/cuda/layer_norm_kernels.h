// Launchers of the fused LayerNorm kernels (layer_norm_kernels.cu, nvcc, no libtorch headers), in
// fp32, the arithmetic of ATen's layer_norm over the last dimension D:
//   mean = sum(x) / D,  var = sum((x - mean)^2) / D,  rstd = rsqrt(var + eps)
//   y = (x - mean) rstd w + b
// add_layer_norm's forms take x = residual + branch, and add the residual path's gradient to dx.
// Backward, with n = (x - mean) rstd and g = dy w:
//   dx = rstd (g - sum(g) / D - n sum(g n) / D),  dw = sum over rows of dy n,  db = sum over rows of dy
// dw and db come as fp32 partial sums per row group, summed by the caller. ATen's CUDA backward
// runs two kernels (dx, then dw/db in GammaBetaBackward, which took 44 us a call for 8192 x 768 on
// an H200); here one kernel reads each row of x and dy once for all three.
// Each returns cudaGetLastError() as an int (0: launched). `stream` is a cudaStream_t.
#pragma once

#include <cstdint>

#include "activation_kernels.h"  // Storage

namespace strata::kernels::cuda {

// x, y: rows x dim; weight, bias: dim (bias may be null); mean and rstd: rows floats, kept for the
// backward. y is stored as y_type (fp32, or autocast's 16-bit dtype: each value rounded once).
// add_layer_norm: with `branch` (rows x dim of branch_type) non-null, the norm is of
// sum = x + branch (fp32, as ATen's add rounds it), written to `sum` (rows x dim); null: of x.
int layer_norm_forward(const float* x, const void* branch, Storage branch_type, float* sum, const float* weight, const float* bias,
                       void* y, Storage y_type, float* mean, float* rstd, int64_t rows, int64_t dim, double eps, void* stream);
// The number of row groups the backward splits the rows into: dweight_partial and dbias_partial
// hold that many rows of dim floats each, zeroed by the caller.
int64_t layer_norm_backward_groups(int64_t rows);
// dy is stored as dy_type (the forward output's); dbias_partial may be null (no bias). x is the
// normalised row (add_layer_norm: the sum). dx_plus (may be null): added to dx (the residual
// path's gradient of the sum); dx_branch (may be null): dx also stored as branch_type.
int layer_norm_backward(const float* x, const float* weight, const float* mean, const float* rstd, const void* dy, Storage dy_type,
                        float* dx, const float* dx_plus, void* dx_branch, Storage branch_type, float* dweight_partial,
                        float* dbias_partial, int64_t rows, int64_t dim, void* stream);

}  // namespace strata::kernels::cuda
