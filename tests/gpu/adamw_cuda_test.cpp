// adamw_update.fused_cuda (kernels/cuda/adamw_fused.cpp) against core's adamw_update.reference on
// the same GPU: five steps on parameters of several sizes (one element, not multiples of the
// vector width, a large one), with and without weight decay. Skips without a CUDA device.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "cuda/adamw_fused.h"
#include "strata/core/operator_table.h"

namespace strata {
namespace {

TEST(AdamwCuda, MatchesTheReferenceOverSteps) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  OperatorTable::global().reset();
  const auto& ref =
      static_cast<const ops::OperatorImpl<ops::AdamwUpdate>&>(*OperatorTable::global().implementations("adamw_update").back());
  ASSERT_EQ(ref.name(), "adamw_update.reference");
  at::manual_seed(0);
  const auto cuda = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  for (int64_t n : {1, 7, 33, 1000, 1 << 20})
    for (double decay : {0.0, 0.1}) {
      SCOPED_TRACE("numel " + std::to_string(n) + ", weight decay " + std::to_string(decay));
      const at::Tensor p0 = at::randn({n}, cuda);
      at::Tensor p[2] = {p0.clone(), p0.clone()}, m[2] = {at::zeros({n}, cuda), at::zeros({n}, cuda)},
                 v[2] = {at::zeros({n}, cuda), at::zeros({n}, cuda)};
      for (int64_t step = 1; step <= 5; ++step) {
        const at::Tensor g = at::randn({n}, cuda);
        ops::AdamwHyper h;
        h.lr = 1e-2, h.beta1 = 0.9, h.beta2 = 0.95, h.eps = 1e-8, h.weight_decay = decay, h.step = step;
        kernels::adamw_update_fused_cuda(p[0], g, m[0], v[0], h);
        ref.fn()(p[1], g, m[1], v[1], h);
      }
      // fp32 arithmetic in another order: a few ulps of the values after five steps.
      for (auto [ours, theirs, what] : {std::tuple{p[0], p[1], "param"}, {m[0], m[1], "exp_avg"}, {v[0], v[1], "exp_avg_sq"}}) {
        const double err = (ours - theirs).abs().max().item<double>(), scale = theirs.abs().max().item<double>();
        EXPECT_LE(err, 1e-6 * std::max(1.0, scale)) << what;
      }
    }
}

// The whole group in one call (what the optimizer does: multi-tensor launches) against the
// reference one tensor at a time.
TEST(AdamwCuda, AGroupInOneCallMatchesTheReference) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  OperatorTable::global().reset();
  const auto& ref =
      static_cast<const ops::OperatorImpl<ops::AdamwUpdate>&>(*OperatorTable::global().implementations("adamw_update").back());
  at::manual_seed(1);
  const auto cuda = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  std::vector<at::Tensor> p[2], m[2], v[2];
  for (int64_t n : {1, 7, 33, 1000, 1 << 20}) {
    const at::Tensor p0 = at::randn({n}, cuda);
    for (int k = 0; k < 2; ++k) p[k].push_back(p0.clone()), m[k].push_back(at::zeros({n}, cuda)), v[k].push_back(at::zeros({n}, cuda));
  }
  for (int64_t step = 1; step <= 5; ++step) {
    std::vector<at::Tensor> g;
    for (const auto& t : p[0]) g.push_back(at::randn_like(t));
    ops::AdamwHyper h;
    h.lr = 1e-2, h.beta1 = 0.9, h.beta2 = 0.95, h.eps = 1e-8, h.weight_decay = 0.1, h.step = step;
    kernels::adamw_update_fused_cuda(p[0], g, m[0], v[0], h);
    for (size_t i = 0; i < g.size(); ++i) ref.fn()(p[1][i], g[i], m[1][i], v[1][i], h);
  }
  for (size_t i = 0; i < p[0].size(); ++i) {
    const double err = (p[0][i] - p[1][i]).abs().max().item<double>(), scale = p[1][i].abs().max().item<double>();
    EXPECT_LE(err, 1e-6 * std::max(1.0, scale)) << "tensor " << i;
  }
}

}  // namespace
}  // namespace strata
