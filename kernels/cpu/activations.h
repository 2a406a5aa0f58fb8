// Fused activations on the CPU: the `gelu` operator (tanh approximation, as GPT-2) and `swiglu`
// (silu(gate) * up, as Llama), each one pass over memory forward and one backward, where the
// references compose ATen kernels (gelu "tanh": its own forward and backward kernels, slow ones
// on this CPU; swiglu: silu, a product, and their backwards with temporaries). The arithmetic is
// activation_math.h; this file is the autograd Functions and threading. Float, bfloat16 and half
// in and out, float arithmetic. Parity with core's references: tests/unit/activations_test.cpp;
// time: bench/activations.cpp.
#pragma once

#include <ATen/core/Tensor.h>

namespace strata::kernels {

// What the operator implementations "gelu.fused_cpu" and "swiglu.fused_cpu" run.
at::Tensor gelu_tanh_fused_cpu(const at::Tensor& x);
at::Tensor swiglu_fused_cpu(const at::Tensor& gate, const at::Tensor& up);

}  // namespace strata::kernels
