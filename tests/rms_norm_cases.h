// The RMSNorm kernels' parity cases against core's rms_norm.reference, shared by the CPU test
// (unit/rms_norm_kernel_test.cpp) and the GPU one (gpu/rms_norm_cuda_test.cpp): output, dx and
// dweight for fp32, bf16 and half with a weight of x's dtype and bf16 x with an fp32 weight (fp32
// output, as the reference promotes), at the row and width counts each test gives.
#pragma once

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "elementwise_error.h"
#include "strata/core/operator_table.h"

namespace strata::testing {

struct RmsNormResult {
  at::Tensor y, dx, dw;
};

template <class Fn>
RmsNormResult run_rms_norm(Fn fn, const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& dy) {
  at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
  at::Tensor y = fn(x, w, 1e-6);
  const auto grads = torch::autograd::grad({y}, {x, w}, {dy.to(y.scalar_type())});
  return {y.detach(), grads[0], grads[1]};
}

inline const ops::OperatorImpl<ops::RmsNorm>& rms_norm_reference() {
  OperatorTable::global().reset();
  return static_cast<const ops::OperatorImpl<ops::RmsNorm>&>(*OperatorTable::global().implementations("rms_norm").back());
}

template <class Fn>
void expect_rms_norm_matches_reference(Fn fused, at::Device device, const std::vector<std::pair<int64_t, int64_t>>& shapes) {
  const auto& ref = rms_norm_reference();
  ASSERT_EQ(ref.name(), "rms_norm.reference");
  struct Types {
    at::ScalarType x, w;
    double tol;  // fp32: summation order; 16-bit: a unit in the last place of the roundings
  };
  for (const Types types : {Types{at::kFloat, at::kFloat, 2e-5}, Types{at::kBFloat16, at::kBFloat16, 2e-2},
                            Types{at::kHalf, at::kHalf, 3e-3}, Types{at::kBFloat16, at::kFloat, 2e-2}})
    for (const auto& [rows, dim] : shapes) {
      SCOPED_TRACE(std::string(c10::toString(types.x)) + " x, " + c10::toString(types.w) + " weight, " + std::to_string(rows) + " x " +
                   std::to_string(dim));
      at::manual_seed(rows + dim);
      const auto on = at::TensorOptions().device(device);
      const at::Tensor x = (at::randn({rows, dim}, on) * 2 + 0.5).to(types.x), w = (at::rand({dim}, on) + 0.5).to(types.w);
      const at::Tensor dy = at::randn({rows, dim}, on) * 3;
      const RmsNormResult ours = run_rms_norm(fused, x, w, dy), theirs = run_rms_norm(ref.fn(), x, w, dy);
      EXPECT_EQ(ours.y.scalar_type(), theirs.y.scalar_type());
      EXPECT_EQ(ours.dx.scalar_type(), types.x);
      EXPECT_EQ(ours.dw.scalar_type(), types.w);
      EXPECT_LE(max_elementwise_error(ours.y, theirs.y), types.tol) << "y";
      EXPECT_LE(max_elementwise_error(ours.dx, theirs.dx), 2 * types.tol) << "dx";
      // dw sums rows of products: relative to its largest entry.
      const double dw_scale = std::max(1.0, theirs.dw.abs().max().to(at::kDouble).item<double>());
      EXPECT_LE((ours.dw.to(at::kDouble) - theirs.dw.to(at::kDouble)).abs().max().item<double>() / dw_scale, 2 * types.tol) << "dw";
    }
}

// A 3-D input; and fp32 x with a bf16 weight, which the kernels leave to the reference.
template <class Fn>
void expect_rms_norm_3d_and_fallback(Fn fused, at::Device device) {
  const auto& ref = rms_norm_reference();
  const auto on = at::TensorOptions().device(device);
  const at::Tensor x = at::randn({2, 5, 64}, on), w = at::rand({64}, on) + 0.5, dy = at::randn({2, 5, 64}, on);
  const RmsNormResult ours = run_rms_norm(fused, x, w, dy), theirs = run_rms_norm(ref.fn(), x, w, dy);
  EXPECT_EQ(ours.y.sizes(), theirs.y.sizes());
  EXPECT_LE(max_elementwise_error(ours.y, theirs.y), 2e-5);
  EXPECT_LE(max_elementwise_error(ours.dx, theirs.dx), 4e-5);
  EXPECT_LE(max_elementwise_error(ours.dw, theirs.dw), 4e-5);
  const RmsNormResult mixed = run_rms_norm(fused, x, w.to(at::kBFloat16), dy), mixed_ref = run_rms_norm(ref.fn(), x, w.to(at::kBFloat16), dy);
  EXPECT_EQ(max_elementwise_error(mixed.y, mixed_ref.y), 0.0);
}

}  // namespace strata::testing
