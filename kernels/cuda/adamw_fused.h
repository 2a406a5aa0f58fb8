// AdamW on CUDA for a whole parameter group at once: ATen's fused multi-tensor AdamW
// (at::_fused_adamw_, what torch.optim.AdamW(fused=True) runs), given the group's lists, so a
// step is a few multi-tensor launches rather than one per parameter. The reference (core's
// adamw_update.reference) issues eight elementwise kernels per parameter; on a GPU the launches,
// not the bytes, are most of a small model's optimizer step (bench/results/step_time_cuda.md).
// Parity: tests/gpu/adamw_cuda_test.cpp.
#pragma once

#include "strata/ops.h"

namespace strata::kernels {

// What "adamw_update.fused_cuda" runs: fp32 CUDA tensors on one device, updated in place.
void adamw_update_fused_cuda(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                             const ops::AdamwHyper& hyper);

}  // namespace strata::kernels
