// The autograd of rope.fused_cuda (rope_cuda.h): launches rope_kernels.h on the tensors' device
// and current stream.
#include "cuda/rope_cuda.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/custom_function.h>

#include "cuda/rope_kernels.h"
#include "cuda/storage_of.h"
#include "strata/ops.h"

namespace strata::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// x [B, H, T, D] (D even, last dimension contiguous) on a GPU in float, bf16 or half; cos and sin
// fp32 on x's device, [T, D/2] or [B, 1, T, D/2], needing no gradient.
bool takes(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const auto type = x.scalar_type();
  if (!x.is_cuda() || (type != at::kFloat && type != at::kBFloat16 && type != at::kHalf) || x.dim() != 4 || x.size(-1) % 2 != 0 ||
      x.stride(-1) != 1)
    return false;
  const int64_t half = x.size(-1) / 2;
  const auto table = [&](const at::Tensor& t) {
    if (t.scalar_type() != at::kFloat || t.device() != x.device() || t.requires_grad()) return false;
    if (t.dim() == 2) return t.size(0) == x.size(2) && t.size(1) == half;
    return t.dim() == 4 && t.size(0) == x.size(0) && t.size(1) == 1 && t.size(2) == x.size(2) && t.size(3) == half;
  };
  return table(cos) && table(sin) && cos.sizes() == sin.sizes();
}

// Runs the kernel on `in` (x forward, dy backward) into a new contiguous tensor.
at::Tensor rotate(const at::Tensor& in, const at::Tensor& cos, const at::Tensor& sin, bool backward) {
  const c10::cuda::CUDAGuard guard(in.device());
  const at::Tensor c = cos.contiguous(), s = sin.contiguous();
  at::Tensor out = at::empty(in.sizes(), in.options().memory_format(at::MemoryFormat::Contiguous));
  const cuda::RopeShape shape{in.size(0),   in.size(1),   in.size(2), in.size(3) / 2, in.stride(0),
                              in.stride(1), in.stride(2), c.dim() == 4 ? c.size(2) * c.size(3) : 0};
  const int error = cuda::rope(storage_of(in.scalar_type()), backward, in.const_data_ptr(), c.const_data_ptr<float>(),
                               s.const_data_ptr<float>(), out.mutable_data_ptr(), shape,
                               static_cast<void*>(c10::cuda::getCurrentCUDAStream().stream()));
  TORCH_CHECK(error == 0, "rope: CUDA kernel launch failed (cudaError ", error, ")");
  return out;
}

class RopeCuda : public torch::autograd::Function<RopeCuda> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    return rotate(x, cos, sin, /*backward=*/false);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    at::Tensor dy = grads[0];
    if (dy.stride(-1) != 1) dy = dy.contiguous();
    return {rotate(dy, saved[0], saved[1], /*backward=*/true), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor rope_fused_cuda(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  if (!takes(x, cos, sin)) {
    const auto& reference = static_cast<const ops::OperatorImpl<ops::Rope>&>(*ops::implementations(ops::Rope::name).back());
    return reference.fn()(x, cos, sin);
  }
  return RopeCuda::apply(x, cos, sin);
}

}  // namespace strata::kernels
