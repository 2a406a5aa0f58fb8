// Launchers of the fused RMSNorm kernels (rms_norm_kernels.cu, nvcc, no libtorch headers), the
// arithmetic of core's rms_norm.reference (Hugging Face's LlamaRMSNorm) in one pass per row:
//   r = rsqrt(mean(x^2) + eps) in fp32,  n = round_T(x r),  y = round_O(w n)
// where T is x's storage and O the output's: T when the weight is T, fp32 when the weight is
// fp32 (as ATen promotes w * n). Backward, with g = round_T(dy w) (the gradient of n, rounded to
// n's dtype as autograd does):
//   dx = round_T(r g - r^3 x sum(g x) / D),  dw = sum over rows of dy n (fp32 partial sums).
// Each returns cudaGetLastError() as an int (0: launched). `stream` is a cudaStream_t.
#pragma once

#include <cstdint>

#include "activation_kernels.h"  // Storage

namespace strata::kernels::cuda {

// x: rows x dim of `x_type`; weight: dim of `weight_type` (x_type or Float); y: rows x dim of
// `out_type` (O above; or bf16/half with fp32 x and weight: autocast's dtype, rounded once); rstd:
// rows floats, kept for the backward. add_rms_norm: with `branch` non-null (rows x dim of
// branch_type: x_type, or bf16/half for fp32 x), the norm is of sum = round_T(x + branch), written
// to `sum` (rows x dim of x_type); null: of x.
int rms_norm_forward(Storage x_type, Storage weight_type, Storage out_type, const void* x, const void* branch, Storage branch_type,
                     void* sum, const void* weight, void* y, float* rstd, int64_t rows, int64_t dim, double eps, void* stream);
// The number of row groups the backward splits the rows into: dweight_partial holds that many
// rows of dim floats, summed by the caller.
int64_t rms_norm_backward_groups(int64_t rows);
// dy: rows x dim of out_type (the forward's output type). x is the normalised row (add_rms_norm:
// the sum). dx_plus (may be null, x_type): added to dx; dx_branch (may be null): dx also stored
// as branch_type.
int rms_norm_backward(Storage x_type, Storage weight_type, Storage out_type, const void* x, const void* weight, const float* rstd,
                      const void* dy, void* dx, const void* dx_plus, void* dx_branch, Storage branch_type, float* dweight_partial,
                      int64_t rows, int64_t dim, void* stream);

}  // namespace strata::kernels::cuda
