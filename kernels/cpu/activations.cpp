// Threading of the fused activations on the CPU (activations.h); the arithmetic is in
// activation_math.cpp, the autograd in activation_autograd.h (shared with the CUDA kernels). Work
// is split into contiguous ranges of at least kGrain elements over ATen's threads.
#include "activations.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "activation_autograd.h"
#include "activation_math.h"

namespace strata::kernels {
namespace {

constexpr int64_t kGrain = 32768;  // 128 KiB of fp32: a range is worth a thread above this

// Calls f with a null pointer of the storage type of `dtype` (float, bfloat16, half).
template <class F>
void with_storage(c10::ScalarType dtype, const char* op, F f) {
  switch (dtype) {
    case at::kFloat: return f(static_cast<float*>(nullptr));
    case at::kBFloat16: return f(static_cast<c10::BFloat16*>(nullptr));
    case at::kHalf: return f(static_cast<c10::Half*>(nullptr));
    default: TORCH_CHECK(false, op, ": the fused CPU kernel takes float, bfloat16 or half, not ", dtype);
  }
}

template <class Body>
void over_ranges(int64_t n, Body body) {
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) { body(begin, end - begin); });
}

// The elementwise passes for activation_autograd.h: this CPU's copy of activation_math.cpp over
// ranges of the contiguous tensors.
struct CpuKernels {
  static void gelu_forward(const at::Tensor& x, const at::Tensor& y) {
    with_storage(x.scalar_type(), "gelu", [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      const T* in = x.const_data_ptr<T>();
      T* out = y.mutable_data_ptr<T>();
      over_ranges(x.numel(), [&](int64_t at, int64_t n) { activation_ops<T>().gelu_tanh_forward(in + at, out + at, n); });
    });
  }
  static void gelu_backward(const at::Tensor& x, const at::Tensor& dy, const at::Tensor& dx) {
    with_storage(x.scalar_type(), "gelu", [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      const T *in = x.const_data_ptr<T>(), *up = dy.const_data_ptr<T>();
      T* out = dx.mutable_data_ptr<T>();
      over_ranges(x.numel(), [&](int64_t at, int64_t n) { activation_ops<T>().gelu_tanh_backward(in + at, up + at, out + at, n); });
    });
  }
  static void swiglu_forward(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& y) {
    with_storage(gate.scalar_type(), "swiglu", [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      const T *g = gate.const_data_ptr<T>(), *u = up.const_data_ptr<T>();
      T* out = y.mutable_data_ptr<T>();
      over_ranges(gate.numel(), [&](int64_t at, int64_t n) { activation_ops<T>().swiglu_forward(g + at, u + at, out + at, n); });
    });
  }
  static void swiglu_backward(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& dy, const at::Tensor& dgate,
                              const at::Tensor& dup) {
    with_storage(gate.scalar_type(), "swiglu", [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      const T *g = gate.const_data_ptr<T>(), *u = up.const_data_ptr<T>(), *d = dy.const_data_ptr<T>();
      T *dg = dgate.mutable_data_ptr<T>(), *du = dup.mutable_data_ptr<T>();
      over_ranges(gate.numel(), [&](int64_t at, int64_t n) {
        activation_ops<T>().swiglu_backward(g + at, u + at, d + at, dg + at, du + at, n);
      });
    });
  }
};

}  // namespace

at::Tensor gelu_tanh_fused_cpu(const at::Tensor& x) { return GeluTanhFunction<CpuKernels>::apply(x); }

at::Tensor swiglu_fused_cpu(const at::Tensor& gate, const at::Tensor& up) { return SwiGluFunction<CpuKernels>::apply(gate, up); }

}  // namespace strata::kernels
