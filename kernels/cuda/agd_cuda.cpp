// agd_cuda.h: the step's constants (cpu/agd_coefficients.h, the CPU kernel's), then one launch on
// the current stream over contiguous views.
#include "cuda/agd_cuda.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cuda/agd_kernels.h"

namespace strata::kernels {

void agd_update_fused_cuda(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                           const at::Tensor& exp_avg_diff_sq, const at::Tensor& max_exp_avg_diff_sq, const at::Tensor& z,
                           const ops::AgdHyper& hyper) {
  const std::vector<at::Tensor> originals{param, exp_avg, exp_avg_diff_sq, max_exp_avg_diff_sq, z};
  for (const at::Tensor& t : {param, grad, exp_avg, exp_avg_diff_sq})
    TORCH_CHECK(t.is_cuda() && t.scalar_type() == at::kFloat && t.numel() == param.numel() && t.device() == param.device(),
                "agd_update.fused_cuda: parameter, gradient and state must be fp32 CUDA tensors of the parameter's size");
  TORCH_CHECK(!hyper.amsgrad || max_exp_avg_diff_sq.defined(), "agd_update.fused_cuda: amsgrad needs max_exp_avg_diff_sq");
  TORCH_CHECK(!hyper.win || z.defined(), "agd_update.fused_cuda: win needs z");
  // Contiguous views (copies where a tensor is strided), written back after.
  std::vector<at::Tensor> work;
  for (const auto& t : originals) work.push_back(t.defined() ? t.contiguous() : t);
  const at::Tensor g = grad.contiguous();
  auto ptr = [](const at::Tensor& t) { return t.defined() ? t.mutable_data_ptr<float>() : nullptr; };
  const c10::cuda::CUDAGuard guard(param.device());
  const int error = cuda::agd_update(ptr(work[0]), g.const_data_ptr<float>(), ptr(work[1]), ptr(work[2]),
                                     hyper.amsgrad ? ptr(work[3]) : nullptr, hyper.win ? ptr(work[4]) : nullptr, param.numel(),
                                     AgdCoefficients<float>(hyper), hyper.amsgrad, hyper.win,
                                     static_cast<void*>(c10::cuda::getCurrentCUDAStream().stream()));
  TORCH_CHECK(error == 0, "agd_update.fused_cuda: CUDA kernel launch failed (cudaError ", error, ")");
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < originals.size(); ++i)
    if (originals[i].defined() && !originals[i].is_same(work[i])) originals[i].copy_(work[i]);
}

}  // namespace strata::kernels
