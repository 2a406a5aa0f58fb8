// A Linear layer's weight gradient and bias gradient in one cuBLASLt GEMM: dW = dy^T x with the
// column sums of dy (db) computed by the GEMM's epilogue (CUBLASLT_EPILOGUE_BGRADB) while dy
// passes through it, instead of a separate reduction kernel reading dy again. cuBLASLt is the
// library libtorch_cuda already loaded; its functions are looked up there at the first call
// (no link-time dependency, so the kernels plugin loads the same on machines without CUDA).
#pragma once

#include <ATen/core/Tensor.h>

namespace strata::kernels {

// rows [N, in] and dy [N, out], both contiguous bf16 or fp16 on one GPU. Writes dw [out, in] and
// db [out] (contiguous, same dtype, same device) on the current stream. False, having written
// nothing, where cuBLASLt is not found or offers no algorithm for this shape, type or alignment;
// the caller then computes them as ATen does.
bool weight_and_bias_gradient_cublaslt(const at::Tensor& rows, const at::Tensor& dy, at::Tensor& dw, at::Tensor& db);

}  // namespace strata::kernels
