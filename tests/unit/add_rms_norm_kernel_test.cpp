// add_rms_norm.fused_cpu (kernels/cpu/rms_norm.cpp) against the unfused step it replaces: ATen's
// add, then rms_norm.fused_cpu, gradients accumulated by autograd. Bit for bit: the sum, the
// norm, and the gradients of the residual, the branch and the weight, for every dtype pairing the
// kernel takes (an fp32 residual with an fp32, bf16 or half branch, autocast's) and the 16-bit
// sums it leaves to the reference, widths around the eight lanes and more rows than threads. Then the
// calls it leaves to the reference (a block whose rms_norm is pinned elsewhere, fp64, shapes that
// broadcast), and the norm's or the sum's gradient missing.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>

#include "cpu/rms_norm.h"
#include "strata/core/component_registry.h"
#include "strata/core/operator_table.h"
#include "strata/core/plugin_loader.h"
#include "../bitwise_equal.h"

namespace strata {
namespace {

struct Grads {
  at::Tensor sum, normed, d_residual, d_x, d_w;
};

// Runs `step` (residual, x, w) -> {sum, normed} and back-propagates d_sum into the sum and d_y
// into the norm (either may be undefined: that output unused).
template <class Step>
Grads run(Step step, const at::Tensor& residual0, const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& d_sum,
          const at::Tensor& d_y) {
  at::Tensor r = residual0.clone().requires_grad_(true), x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
  const ops::AddNormResult out = step(r, x, w);
  std::vector<at::Tensor> outputs, seeds;
  if (d_sum.defined()) outputs.push_back(out.sum), seeds.push_back(d_sum.to(out.sum.scalar_type()));
  if (d_y.defined()) outputs.push_back(out.normed), seeds.push_back(d_y.to(out.normed.scalar_type()));
  const auto g = torch::autograd::grad(outputs, {r, x, w}, seeds, std::nullopt, false, /*allow_unused=*/true);
  return {out.sum.detach(), out.normed.detach(), g[0], g[1], g[2]};
}

// Whether the fused kernels served (their autograd node), not the reference's add.
bool took_the_kernels(const at::Tensor& r, const at::Tensor& x, const at::Tensor& w) {
  const at::Tensor sum = kernels::add_rms_norm_fused_cpu(r.detach().requires_grad_(true), x, w, 1e-6).sum;
  return sum.grad_fn() && sum.grad_fn()->name().find("AddRmsNormFunction") != std::string::npos;
}

ops::AddNormResult unfused(const at::Tensor& r, const at::Tensor& x, const at::Tensor& w) {
  at::Tensor sum = r + x;
  return {sum, kernels::rms_norm_fused_cpu(sum, w, 1e-6)};
}
ops::AddNormResult fused(const at::Tensor& r, const at::Tensor& x, const at::Tensor& w) {
  return kernels::add_rms_norm_fused_cpu(r, x, w, 1e-6);
}

using testing::expect_bitwise_equal;

void expect_same(const Grads& a, const Grads& b) {
  expect_bitwise_equal(a.sum, b.sum, "sum");
  expect_bitwise_equal(a.normed, b.normed, "normed");
  expect_bitwise_equal(a.d_residual, b.d_residual, "residual gradient");
  expect_bitwise_equal(a.d_x, b.d_x, "x gradient");
  expect_bitwise_equal(a.d_w, b.d_w, "weight gradient");
}

class AddRmsNormKernel : public ::testing::Test {
 protected:
  void SetUp() override {
    static ComponentRegistry registry;
    static const bool loaded = [] {
      PluginLoader(registry).load_search_path({STRATA_KERNELS_PLUGIN});
      return true;
    }();
    (void)loaded;
    OperatorTable::global().install(registry);
  }
  void TearDown() override { OperatorTable::global().reset(); }
};

TEST_F(AddRmsNormKernel, TheKernelsPluginServesIt) {
  EXPECT_EQ(ops::select("add_rms_norm", at::randn({3, 5})).name(), "add_rms_norm.fused_cpu");
  EXPECT_EQ(ops::select("add_rms_norm", at::randn({3, 5}, at::kDouble)).name(), "add_rms_norm.reference");
}

TEST_F(AddRmsNormKernel, BitForBitTheAddAndTheFusedNorm) {
  struct Types {
    at::ScalarType residual, x, w;
  };
  for (const Types t : {Types{at::kFloat, at::kFloat, at::kFloat}, Types{at::kBFloat16, at::kBFloat16, at::kBFloat16},
                        Types{at::kHalf, at::kHalf, at::kHalf}, Types{at::kFloat, at::kBFloat16, at::kFloat},
                        Types{at::kFloat, at::kHalf, at::kFloat}, Types{at::kBFloat16, at::kBFloat16, at::kFloat}})
    for (const auto& [rows, dim] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {5, 7}, {3, 9}, {33, 256}, {3000, 100}}) {
      SCOPED_TRACE(std::string(c10::toString(t.residual)) + " residual, " + c10::toString(t.x) + " x, " + c10::toString(t.w) +
                   " weight, " + std::to_string(rows) + " x " + std::to_string(dim));
      at::manual_seed(rows * 31 + dim);
      const at::Tensor r = (at::randn({rows, dim}) * 2).to(t.residual), x = (at::randn({rows, dim}) + 0.5).to(t.x);
      const at::Tensor w = (at::rand({dim}) + 0.5).to(t.w), d_sum = at::randn({rows, dim}), d_y = at::randn({rows, dim}) * 3;
      expect_same(run(fused, r, x, w, d_sum, d_y), run(unfused, r, x, w, d_sum, d_y));
      EXPECT_EQ(took_the_kernels(r, x, w), t.residual == at::kFloat);  // 16-bit sums: the reference (slower fused on the CPU)
    }
}

TEST_F(AddRmsNormKernel, ThreeDimensionsAndAMissingGradient) {
  const at::Tensor r = at::randn({2, 5, 64}), x = at::randn({2, 5, 64}).to(at::kBFloat16), w = at::rand({64}) + 0.5;
  const at::Tensor d = at::randn({2, 5, 64});
  expect_same(run(fused, r, x, w, d, d), run(unfused, r, x, w, d, d));
  expect_same(run(fused, r, x, w, at::Tensor(), d), run(unfused, r, x, w, at::Tensor(), d));  // the sum unused after
  const Grads only_sum = run(fused, r, x, w, d, at::Tensor());                               // the norm unused
  expect_bitwise_equal(only_sum.d_residual, d, "residual gradient");
  expect_bitwise_equal(only_sum.d_x, d.to(at::kBFloat16), "x gradient");
}

// Where the kernels do not serve, the result is the reference's: the add, then whatever serves
// rms_norm in the block.
TEST_F(AddRmsNormKernel, LeavesToTheReferenceWhatItDoesNotTake) {
  const auto reference = [](const at::Tensor& r, const at::Tensor& x, const at::Tensor& w) {
    const at::Tensor sum = r + x;
    return ops::AddNormResult{sum, ops::rms_norm(sum, w, 1e-6)};
  };
  const at::Tensor r = at::randn({6, 16}), x = at::randn({6, 16}), w = at::rand({16}) + 0.5, d = at::randn({6, 16});
  ops::pin("rms_norm", "rms_norm.reference");  // the user's pin of the norm holds inside the residual step
  ASSERT_EQ(ops::select("rms_norm", r).name(), "rms_norm.reference");
  expect_same(run(fused, r, x, w, d, d), run(reference, r, x, w, d, d));
  EXPECT_FALSE(took_the_kernels(r, x, w));
  SetUp();  // the plugin's implementations again, without the pin
  ASSERT_EQ(ops::select("rms_norm", r).name(), "rms_norm.fused_cpu");
  const at::Tensor r64 = r.to(at::kDouble), x64 = x.to(at::kDouble), w64 = w.to(at::kDouble);
  ASSERT_TRUE(took_the_kernels(r, x, w));
  expect_same(run(fused, r64, x64, w64, d, d), run(reference, r64, x64, w64, d, d));
  EXPECT_FALSE(took_the_kernels(r64, x64, w64));
  EXPECT_FALSE(took_the_kernels(r, at::randn({1, 16}), w));
  const at::Tensor row = at::randn({1, 16});  // x broadcast over the residual's rows
  const Grads broadcast = run(fused, r, row, w, d, d), broadcast_ref = run(reference, r, row, w, d, d);
  expect_bitwise_equal(broadcast.normed, broadcast_ref.normed, "normed");
  expect_bitwise_equal(broadcast.d_x, broadcast_ref.d_x, "x gradient");
  const at::Tensor r_bf16 = r.to(at::kBFloat16);  // a 16-bit residual under an fp32 branch: the sum is fp32
  expect_bitwise_equal(run(fused, r_bf16, x, w, d, d).sum, run(reference, r_bf16, x, w, d, d).sum, "sum");
}

}  // namespace
}  // namespace strata
