// AdamW on CUDA in one kernel per parameter: ATen's fused multi-tensor AdamW
// (at::_fused_adamw_, what torch.optim.AdamW(fused=True) runs) given one parameter at a time.
// The reference (core's adamw_update.reference) issues eight elementwise kernels per parameter;
// on a GPU the launches, not the bytes, are most of a small model's optimizer step
// (bench/results/step_time_cuda.md). Parity: tests/gpu/adamw_cuda_test.cpp.
#pragma once

#include "strata/ops.h"

namespace strata::kernels {

// What "adamw_update.fused_cuda" runs: fp32 CUDA tensors, updated in place.
void adamw_update_fused_cuda(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                             const at::Tensor& exp_avg_sq, const ops::AdamwHyper& hyper);

}  // namespace strata::kernels
