// The autograd of the fused activations, shared by the CPU kernels (activations.cpp) and the CUDA
// ones (kernels/cuda/activations_cuda.cpp). Each Function saves its inputs, as the references'
// autograd does (x for gelu; gate and up for swiglu), and its backward recomputes the sigmoid
// rather than keeping another tensor. `Kernels` supplies the elementwise passes over contiguous
// tensors of one dtype, outputs allocated by the caller:
//   static void gelu_forward(const at::Tensor& x, const at::Tensor& y);
//   static void gelu_backward(const at::Tensor& x, const at::Tensor& dy, const at::Tensor& dx);
//   static void swiglu_forward(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& y);
//   static void swiglu_backward(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& dy,
//                               const at::Tensor& dgate, const at::Tensor& dup);
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

namespace strata::kernels {

template <class Kernels>
class GeluTanhFunction : public torch::autograd::Function<GeluTanhFunction<Kernels>> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input) {
    const at::Tensor x = input.contiguous();
    at::Tensor y = at::empty_like(x);
    Kernels::gelu_forward(x, y);
    ctx->save_for_backward({x});
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0], dy = grads[0].to(x.scalar_type()).contiguous();
    at::Tensor dx = at::empty_like(x);
    Kernels::gelu_backward(x, dy, dx);
    return {dx};
  }
};

template <class Kernels>
class SwiGluFunction : public torch::autograd::Function<SwiGluFunction<Kernels>> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& gate_in, const at::Tensor& up_in) {
    TORCH_CHECK(gate_in.sizes() == up_in.sizes() && gate_in.scalar_type() == up_in.scalar_type(),
                "swiglu: the fused kernel needs gate and up of one shape and dtype, not ", gate_in.sizes(), " ",
                gate_in.scalar_type(), " and ", up_in.sizes(), " ", up_in.scalar_type());
    const at::Tensor gate = gate_in.contiguous(), up = up_in.contiguous();
    at::Tensor y = at::empty_like(gate);
    Kernels::swiglu_forward(gate, up, y);
    ctx->save_for_backward({gate, up});
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor &gate = saved[0], &up = saved[1], dy = grads[0].to(gate.scalar_type()).contiguous();
    at::Tensor dgate = at::empty_like(gate), dup = at::empty_like(up);
    Kernels::swiglu_backward(gate, up, dy, dgate, dup);
    return {dgate, dup};
  }
};

}  // namespace strata::kernels
