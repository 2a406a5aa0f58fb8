// AGD's update on CUDA in one kernel per parameter (agd_kernels.cu): the agd_update operator's
// "agd_update.fused_cuda", fp32. Against core's agd_update.reference (about fifteen ATen kernels
// and two temporaries the parameter's size per parameter), it reads and writes each element
// once. Parity: tests/gpu/agd_cuda_test.cpp, run by scripts/gpu_check.
#pragma once

#include "strata/ops.h"

namespace strata::kernels {

void agd_update_fused_cuda(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                           const at::Tensor& exp_avg_diff_sq, const at::Tensor& max_exp_avg_diff_sq, const at::Tensor& z,
                           const ops::AgdHyper& hyper);

}  // namespace strata::kernels
