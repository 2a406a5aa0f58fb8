// Autograd and threading of the fused activations (activations.h); the arithmetic is in
// activation_math.cpp. Each Function saves its inputs (as the references' autograd does: x for
// gelu, gate and up for swiglu) and recomputes the sigmoid in the backward rather than keeping
// another tensor. Work is split into contiguous ranges of at least kGrain elements over ATen's
// threads.
#include "activations.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include "activation_math.h"

namespace strata::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

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

class GeluTanh : public torch::autograd::Function<GeluTanh> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input) {
    const at::Tensor x = input.contiguous();
    at::Tensor y = at::empty_like(x);
    with_storage(x.scalar_type(), "gelu", [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      const T* in = x.const_data_ptr<T>();
      T* out = y.mutable_data_ptr<T>();
      over_ranges(x.numel(), [&](int64_t at, int64_t n) { activation_ops<T>().gelu_tanh_forward(in + at, out + at, n); });
    });
    ctx->save_for_backward({x});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0], dy = grads[0].to(x.scalar_type()).contiguous();
    at::Tensor dx = at::empty_like(x);
    with_storage(x.scalar_type(), "gelu", [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      const T *in = x.const_data_ptr<T>(), *up = dy.const_data_ptr<T>();
      T* out = dx.mutable_data_ptr<T>();
      over_ranges(x.numel(), [&](int64_t at, int64_t n) { activation_ops<T>().gelu_tanh_backward(in + at, up + at, out + at, n); });
    });
    return {dx};
  }
};

class SwiGlu : public torch::autograd::Function<SwiGlu> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate_in, const at::Tensor& up_in) {
    TORCH_CHECK(gate_in.sizes() == up_in.sizes() && gate_in.scalar_type() == up_in.scalar_type(),
                "swiglu: the fused CPU kernel needs gate and up of one shape and dtype, not ", gate_in.sizes(), " ",
                gate_in.scalar_type(), " and ", up_in.sizes(), " ", up_in.scalar_type());
    const at::Tensor gate = gate_in.contiguous(), up = up_in.contiguous();
    at::Tensor y = at::empty_like(gate);
    with_storage(gate.scalar_type(), "swiglu", [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      const T *g = gate.const_data_ptr<T>(), *u = up.const_data_ptr<T>();
      T* out = y.mutable_data_ptr<T>();
      over_ranges(gate.numel(), [&](int64_t at, int64_t n) { activation_ops<T>().swiglu_forward(g + at, u + at, out + at, n); });
    });
    ctx->save_for_backward({gate, up});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &gate = saved[0], &up = saved[1], dy = grads[0].to(gate.scalar_type()).contiguous();
    at::Tensor dgate = at::empty_like(gate), dup = at::empty_like(up);
    with_storage(gate.scalar_type(), "swiglu", [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      const T *g = gate.const_data_ptr<T>(), *u = up.const_data_ptr<T>(), *d = dy.const_data_ptr<T>();
      T *dg = dgate.mutable_data_ptr<T>(), *du = dup.mutable_data_ptr<T>();
      over_ranges(gate.numel(), [&](int64_t at, int64_t n) {
        activation_ops<T>().swiglu_backward(g + at, u + at, d + at, dg + at, du + at, n);
      });
    });
    return {dgate, dup};
  }
};

}  // namespace

at::Tensor gelu_tanh_fused_cpu(const at::Tensor& x) { return GeluTanh::apply(x); }

at::Tensor swiglu_fused_cpu(const at::Tensor& gate, const at::Tensor& up) { return SwiGlu::apply(gate, up); }

}  // namespace strata::kernels
