// The CUDA kernels' side of activation_autograd.h: launches on the current stream, errors as
// c10::Error naming the operator.
#include "cuda/activations_cuda.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cpu/activation_autograd.h"
#include "cuda/activation_kernels.h"

namespace strata::kernels {
namespace {

cuda::Storage storage_of(const at::Tensor& t, const char* op) {
  switch (t.scalar_type()) {
    case at::kFloat: return cuda::Storage::Float;
    case at::kBFloat16: return cuda::Storage::BFloat16;
    case at::kHalf: return cuda::Storage::Half;
    default: TORCH_CHECK(false, op, ": the fused CUDA kernel takes float, bfloat16 or half, not ", t.scalar_type());
  }
}

// Runs `launch(stream)` on the tensor's device and current stream; a nonzero result is a CUDA error.
template <class Launch>
void on_stream(const at::Tensor& t, const char* op, Launch launch) {
  TORCH_CHECK(t.is_cuda(), op, ": the fused CUDA kernel needs CUDA tensors");
  const c10::cuda::CUDAGuard guard(t.device());
  const int error = launch(static_cast<void*>(c10::cuda::getCurrentCUDAStream().stream()));
  TORCH_CHECK(error == 0, op, ": CUDA kernel launch failed (cudaError ", error, ")");
}

struct CudaKernels {
  static void gelu_forward(const at::Tensor& x, const at::Tensor& y) {
    on_stream(x, "gelu", [&](void* s) { return cuda::gelu_tanh_forward(storage_of(x, "gelu"), x.const_data_ptr(), y.mutable_data_ptr(), x.numel(), s); });
  }
  static void gelu_backward(const at::Tensor& x, const at::Tensor& dy, const at::Tensor& dx) {
    on_stream(x, "gelu", [&](void* s) {
      return cuda::gelu_tanh_backward(storage_of(x, "gelu"), x.const_data_ptr(), dy.const_data_ptr(), dx.mutable_data_ptr(), x.numel(), s);
    });
  }
  static void swiglu_forward(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& y) {
    on_stream(gate, "swiglu", [&](void* s) {
      return cuda::swiglu_forward(storage_of(gate, "swiglu"), gate.const_data_ptr(), up.const_data_ptr(), y.mutable_data_ptr(), gate.numel(), s);
    });
  }
  static void swiglu_backward(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& dy, const at::Tensor& dgate,
                              const at::Tensor& dup) {
    on_stream(gate, "swiglu", [&](void* s) {
      return cuda::swiglu_backward(storage_of(gate, "swiglu"), gate.const_data_ptr(), up.const_data_ptr(), dy.const_data_ptr(),
                                   dgate.mutable_data_ptr(), dup.mutable_data_ptr(), gate.numel(), s);
    });
  }
};

}  // namespace

at::Tensor gelu_tanh_fused_cuda(const at::Tensor& x) { return GeluTanhFunction<CudaKernels>::apply(x); }

at::Tensor swiglu_fused_cuda(const at::Tensor& gate, const at::Tensor& up) { return SwiGluFunction<CudaKernels>::apply(gate, up); }

}  // namespace strata::kernels
