// AdamW's update in one pass over each tensor (the adamw_update operator, ops.h): every element's
// parameter, gradient and two moments are read once and written once, where the reference
// (torch.optim.AdamW's arithmetic, one ATen call per line) makes about ten passes and allocates
// two temporaries the size of the parameter. Same operations in the same order, in fp32;
// vectorised with at::vec in adamw_math.cpp (compiled generic and AVX2+FMA). Parity:
// tests/unit/adamw_kernel_test.cpp; time: bench/adamw_update.cpp.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "adamw_rows.h"
#include "strata/ops.h"

namespace strata::kernels {

// The step's constants (adamw_rows.h), from the hyperparameters.
AdamwCoefficients adamw_coefficients(const ops::AdamwHyper& h);

// What "adamw_update.fused_cpu" runs: fp32 tensors, each parameter with a gradient and moments
// of its size (strided ones through contiguous copies written back), one after another.
void adamw_update_fused_cpu(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                            const ops::AdamwHyper& hyper);

}  // namespace strata::kernels
