// The autograd side of cross_entropy.fused_cuda (cross_entropy_cuda.h): launches the kernel on
// the logits' device and current stream; loss and scaling stay on the device.
#include "cuda/cross_entropy_cuda.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/custom_function.h>

#include "cpu/cross_entropy.h"  // cross_entropy_reference_call
#include "cuda/cross_entropy_kernels.h"
#include "cuda/storage_of.h"

namespace strata::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class FusedCrossEntropyCuda : public torch::autograd::Function<FusedCrossEntropyCuda> {
 public:
  // with_grads: whether backward will run (decided by the caller, where grad mode is visible).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& targets, bool with_grads) {
    const c10::cuda::CUDAGuard guard(logits.device());
    const at::Tensor z = logits.contiguous(), t = targets.contiguous();
    const int64_t rows = z.size(0), vocab = z.size(1);
    at::Tensor grad = with_grads ? at::empty(z.sizes(), z.options().dtype(at::kFloat)) : at::Tensor();
    const at::Tensor row_loss = at::empty({rows}, z.options().dtype(at::kFloat));
    const int error = cuda::cross_entropy_forward(storage_of(z.scalar_type()), z.const_data_ptr(), t.const_data_ptr<int64_t>(),
                                                  cuda::Storage::Float, with_grads ? grad.mutable_data_ptr<float>() : nullptr,
                                                  row_loss.mutable_data_ptr<float>(), rows, vocab, vocab,
                                                  c10::cuda::getCurrentCUDAStream().stream());
    TORCH_CHECK(error == 0, "cross_entropy: CUDA kernel launch failed (cudaError ", error, ")");
    // C, the counted rows, as a device scalar: 0/0 gives the reference's NaN loss.
    const at::Tensor count = t.ne(-100).sum().to(at::kDouble);
    if (with_grads) ctx->save_for_backward({grad, count});
    ctx->saved_data["with_grads"] = with_grads;
    ctx->saved_data["logits_dtype"] = z.scalar_type();
    return (row_loss.sum(0, false, at::kDouble) / count).to(at::kFloat);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    if (!ctx->saved_data["with_grads"].toBool())
      throw std::logic_error("cross_entropy (fused, CUDA): backward of a call made without gradients");
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &grad = saved[0], &count = saved[1];
    // g / C in float (C at least 1: with no counted row every gradient row is 0 and stays 0),
    // times the float gradient, rounded once to the logits' dtype. mul_out into a tensor of that
    // dtype: on CUDA ATen computes in float and casts as it writes, so bfloat16/half logits get no
    // float [N, V] product besides G.
    const at::Tensor scale = (grad_outputs[0].to(at::kDouble) / count.clamp_min(1)).to(at::kFloat);
    at::Tensor dlogits = at::empty(grad.sizes(), grad.options().dtype(ctx->saved_data["logits_dtype"].toScalarType()));
    at::mul_out(dlogits, grad, scale);
    return {dlogits, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor cross_entropy_fused_cuda(const at::Tensor& logits, const at::Tensor& targets) {
  const bool ours = logits.device().is_cuda() && targets.device() == logits.device() && logits.dim() == 2 && targets.dim() == 1 &&
                    targets.size(0) == logits.size(0) && targets.scalar_type() == at::kLong && logits.size(1) > 0 &&
                    (logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kBFloat16 ||
                     logits.scalar_type() == at::kHalf);
  if (!ours) return cross_entropy_reference_call(logits, targets);
  const bool with_grads = at::GradMode::is_enabled() && logits.requires_grad();
  return FusedCrossEntropyCuda::apply(logits, targets, with_grads);
}

void cross_entropy_chunk_loss_cuda(const at::Tensor& logits, int64_t vocab, const at::Tensor& targets, const at::Tensor& loss_sum,
                                   const at::Tensor& grad) {
  TORCH_CHECK(logits.is_contiguous() && (!grad.defined() || grad.is_contiguous()),
              "cross_entropy (chunk, CUDA): contiguous logits and a contiguous gradient expected");
  const c10::cuda::CUDAGuard guard(logits.device());
  const int64_t rows = logits.size(0);
  const at::Tensor t = targets.contiguous();
  const at::Tensor row_loss = at::empty({rows}, logits.options().dtype(at::kFloat));
  const int error = cuda::cross_entropy_forward(storage_of(logits.scalar_type()), logits.const_data_ptr(), t.const_data_ptr<int64_t>(),
                                                grad.defined() ? storage_of(grad.scalar_type()) : cuda::Storage::Float,
                                                grad.defined() ? grad.mutable_data_ptr() : nullptr, row_loss.mutable_data_ptr<float>(), rows,
                                                vocab, logits.size(1), c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(error == 0, "cross_entropy (chunk): CUDA kernel launch failed (cudaError ", error, ")");
  loss_sum.add_(row_loss.sum(0, false, at::kDouble));
}

}  // namespace strata::kernels
