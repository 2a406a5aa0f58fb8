// A Linear layer on a GPU whose backward computes the bias gradient inside the weight-gradient
// GEMM (cuda/cublaslt_weight_gradient.h): ATen's Linear backward runs a separate column sum of dy
// for every bias, 48 kernels and about 1 ms of a GPT-2 124M bf16 step on an H200
// (bench/results/step_time_cuda_bf16.md, runs 6-8), which the epilogue folds into a GEMM that
// reads dy anyway. The forward and the input gradient are ATen's (the same cuBLAS calls as
// at::linear). bf16 and fp16 Linears with a bias, also under autocast; every other call goes to
// at::linear. Registered at priority 0 (opt-in) until a GPU run has measured it (kernels/README.md):
// a strategy selects it with module_replace (`linear = "linear.cublaslt_cuda"`). Parity:
// tests/gpu/linear_cublaslt_cuda_test.cpp; in training: scripts/gpu_check.
#pragma once

#include <optional>

#include <ATen/core/Tensor.h>

namespace strata::kernels {

// What the operator implementation "linear.cublaslt_cuda" runs.
at::Tensor linear_cublaslt_cuda(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias);

// Its autograd function: x, weight and bias of one 16-bit type, autocast off. On CPU tensors (the
// unit tests) the weight and bias gradients take ATen's way, as where cuBLASLt offers nothing.
at::Tensor linear_bias_gradient_in_gemm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

}  // namespace strata::kernels
