// The fused CPU implementation of the agd_update operator.
#pragma once

#include "strata/ops.h"

namespace strata::agd {

void agd_update_fused_cpu(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                          const at::Tensor& exp_avg_diff_sq, const at::Tensor& max_exp_avg_diff_sq, const at::Tensor& z,
                          const ops::AgdHyper& hyper);

}  // namespace strata::agd
