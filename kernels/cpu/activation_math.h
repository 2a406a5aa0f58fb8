// The elementwise arithmetic of the fused activations (kernels/cpu/activations.cpp): GELU with
// the tanh approximation and SwiGLU, forward and backward, over contiguous arrays. Written once
// with ATen's at::vec in activation_math.cpp and compiled per CPU capability (generic, and AVX2
// with FMA on x86-64), each copy in its own namespace, like attention_rows.h; activation_ops()
// picks the copy this CPU runs. Storage is float, bfloat16 or half; the arithmetic is float.
//
//   gelu(x)   = 0.5 x (1 + tanh(u)) = x s,   u = k (x + c x^3), k = sqrt(2/pi), c = 0.044715,
//               s = sigmoid(2u) = 1 / (1 + exp(-2u))      (0.5 (1 + tanh u) = sigmoid(2u));
//   gelu'(x)  = s + 2 x s (1 - s) k (1 + 3 c x^2)         (1 - tanh^2 u = 4 s (1 - s));
//   swiglu(g, u) = silu(g) u = g s u,  s = sigmoid(g);
//   d/dg = dy u s (1 + g (1 - s)),  d/du = dy g s.
// One exp per element each way, and no 1 + tanh(u), whose cancellation for negative x the
// reference (ATen's gelu "tanh") pays in precision.
#pragma once

#include <cstdint>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

namespace strata::kernels {

template <class T>
struct ActivationOps {
  void (*gelu_tanh_forward)(const T* x, T* y, int64_t n);
  void (*gelu_tanh_backward)(const T* x, const T* dy, T* dx, int64_t n);
  void (*swiglu_forward)(const T* gate, const T* up, T* y, int64_t n);
  void (*swiglu_backward)(const T* gate, const T* up, const T* dy, T* dgate, T* dup, int64_t n);
};

// The copy for this CPU (activation_math_dispatch in cpu_dispatch.cpp).
template <class T>
const ActivationOps<T>& activation_ops();

// Each compiled copy of activation_math.cpp defines these in namespace `generic` and, on x86-64,
// `avx2`.
#define STRATA_DECLARE_ACTIVATION_OPS(copy)                \
  namespace copy {                                         \
  const ActivationOps<float>& activation_ops_float();      \
  const ActivationOps<c10::BFloat16>& activation_ops_bf16(); \
  const ActivationOps<c10::Half>& activation_ops_half();   \
  }
STRATA_DECLARE_ACTIVATION_OPS(generic)
STRATA_DECLARE_ACTIVATION_OPS(avx2)
#undef STRATA_DECLARE_ACTIVATION_OPS

}  // namespace strata::kernels
