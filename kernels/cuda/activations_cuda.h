// Fused activations on a GPU: the `gelu` operator (tanh approximation, as GPT-2) and `swiglu`
// (silu(gate) * up, as Llama), one kernel each way (cuda/activation_kernels.cu), the autograd
// shared with the CPU kernels (cpu/activation_autograd.h). Float, bfloat16 and half in and out,
// float arithmetic. Parity with core's references: tests/gpu/activations_cuda_test.cpp; time and
// memory: bench/activations_cuda.cpp (on a GPU: scripts/gpu_check). Built where nvcc is
// (STRATA_HAVE_CUDA_KERNELS, kernels/CMakeLists.txt).
#pragma once

#include <ATen/core/Tensor.h>

namespace strata::kernels {

// What the operator implementations "gelu.fused_cuda" and "swiglu.fused_cuda" run.
at::Tensor gelu_tanh_fused_cuda(const at::Tensor& x);
at::Tensor swiglu_fused_cuda(const at::Tensor& gate, const at::Tensor& up);

}  // namespace strata::kernels
