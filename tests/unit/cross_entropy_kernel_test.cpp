// cross_entropy.fused_cpu (kernels/cpu/cross_entropy.cpp) against the reference's own call
// (at::cross_entropy_loss on fp32 logits) and the fp64 formula: the loss and the logits'
// gradient at vocabularies below, at and above the vector width (1, 7, 8, 9, 100, 4099) and
// more rows than threads, with ignored (-100) rows; bfloat16 and half logits; an incoming
// gradient other than 1, fp16 loss scaling on half logits; no rows counted; evaluation without gradients; a target out of range;
// and the plugin serving it.
#include <array>
#include <cmath>
#include <stdexcept>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "cpu/cross_entropy.h"
#include "strata/core/component_registry.h"
#include "strata/core/operator_table.h"
#include "strata/core/plugin_loader.h"
#include "strata/ops.h"
#include "../elementwise_error.h"

namespace strata {
namespace {

using testing::scaled_error;

struct LossAndGrad {
  at::Tensor loss, grad;
};

template <class Fn>
LossAndGrad run(Fn fn, const at::Tensor& logits0, const at::Tensor& targets, double scale = 1.0) {
  const at::Tensor logits = logits0.clone().requires_grad_(true);
  const at::Tensor loss = fn(logits, targets);
  const at::Tensor grad = torch::autograd::grad({loss * scale}, {logits})[0];
  return {loss.detach(), grad};
}

at::Tensor fused(const at::Tensor& logits, const at::Tensor& targets) { return kernels::cross_entropy_fused_cpu(logits, targets); }
at::Tensor reference(const at::Tensor& logits, const at::Tensor& targets) {
  return at::cross_entropy_loss(logits.to(at::kFloat), targets);
}
at::Tensor exact(const at::Tensor& logits, const at::Tensor& targets) { return at::cross_entropy_loss(logits, targets); }

// Targets in [0, vocab) with every third row ignored (when there is more than one row).
at::Tensor targets_for(int64_t rows, int64_t vocab) {
  at::Tensor t = at::randint(vocab, {rows}, at::kLong);
  if (rows > 1) t.slice(0, 0, rows, 3).fill_(-100);
  return t;
}

TEST(CrossEntropyKernel, MatchesTheReferenceAndTheFormula) {
  at::manual_seed(0);
  for (const auto& [rows, vocab] : std::vector<std::array<int64_t, 2>>{{1, 1}, {3, 7}, {5, 8}, {17, 9}, {33, 100}, {300, 33}, {64, 4099}}) {
    const at::Tensor logits = at::randn({rows, vocab}) * 3, targets = targets_for(rows, vocab);
    const LossAndGrad ours = run(fused, logits, targets), ref = run(reference, logits, targets);
    const LossAndGrad formula = run(exact, logits.to(at::kDouble), targets);
    EXPECT_EQ(ours.loss.scalar_type(), at::kFloat);
    EXPECT_EQ(ours.loss.dim(), 0);
    EXPECT_LE(scaled_error(ours.loss, formula.loss), 1e-6) << rows << " x " << vocab;
    EXPECT_LE(scaled_error(ours.grad, formula.grad), 1e-6) << rows << " x " << vocab;
    EXPECT_LE(scaled_error(ours.grad, ref.grad), 1e-6) << rows << " x " << vocab;
    EXPECT_TRUE(at::equal(ours.grad.slice(0, 0, rows > 1 ? rows : 0, 3), at::zeros_like(ours.grad.slice(0, 0, rows > 1 ? rows : 0, 3))));
  }
}

TEST(CrossEntropyKernel, LowPrecisionLogitsRoundTheGradientAsTheReference) {
  at::manual_seed(1);
  for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    const at::Tensor logits = (at::randn({70, 1001}) * 2).to(dtype), targets = targets_for(70, 1001);
    const LossAndGrad ours = run(fused, logits, targets), ref = run(reference, logits, targets);
    EXPECT_EQ(ours.grad.scalar_type(), dtype);
    EXPECT_LE(scaled_error(ours.loss, ref.loss), 1e-6) << c10::toString(dtype);
    // The same fp32 values rounded once to the dtype: at most one rounding apart.
    EXPECT_LE(scaled_error(ours.grad, ref.grad), dtype == at::kBFloat16 ? 8e-3 : 1e-3) << c10::toString(dtype);
  }
}

// fp16 loss scaling (g = 65536): g G must be rounded to half once, after scaling. Rounding G
// first flushes its small entries (below half's 6e-8) to zero before they are scaled up, which
// made amp.fp16_close_to_fp32's loss curve drift by 2e-2. Every entry that is a normal half
// number once scaled must be within one half rounding of the fp32 reference's g G.
TEST(CrossEntropyKernel, HalfLogitsUnderLossScalingRoundOnceAfterScaling) {
  at::manual_seed(4);
  const double scale = 65536.0;
  const at::Tensor logits = (at::randn({48, 4099}) * 3).to(at::kHalf), targets = targets_for(48, 4099);
  const LossAndGrad ours = run(fused, logits, targets, scale), ref = run(reference, logits, targets, scale);
  EXPECT_EQ(ours.grad.scalar_type(), at::kHalf);
  const at::Tensor expected = ref.grad.to(at::kFloat), got = ours.grad.to(at::kFloat);
  const at::Tensor normal = expected.abs() >= 6.2e-5;  // half's smallest normal number
  ASSERT_GT(normal.sum().item<int64_t>(), 0);
  const at::Tensor relative = ((got - expected).abs() / expected.abs()).masked_select(normal);
  EXPECT_LE(relative.max().item<double>(), 1e-3);
}

TEST(CrossEntropyKernel, ScalesByTheIncomingGradient) {
  at::manual_seed(2);
  const at::Tensor logits = at::randn({40, 50}), targets = targets_for(40, 50);
  for (const double scale : {0.5, -3.0, 0.0}) {
    const LossAndGrad ours = run(fused, logits, targets, scale), ref = run(exact, logits.to(at::kDouble), targets, scale);
    if (scale == 0.0) {
      EXPECT_EQ(ours.grad.abs().max().item<float>(), 0.0f);
    } else {
      EXPECT_LE(scaled_error(ours.grad, ref.grad), 1e-6) << scale;
    }
  }
}

TEST(CrossEntropyKernel, NoCountedRowAndEvaluation) {
  at::manual_seed(3);
  const at::Tensor logits = at::randn({6, 10});
  const at::Tensor ignored = at::full({6}, -100, at::kLong);
  const LossAndGrad ours = run(fused, logits, ignored), ref = run(reference, logits, ignored);
  EXPECT_TRUE(std::isnan(ours.loss.item<float>()) && std::isnan(ref.loss.item<float>()));
  EXPECT_TRUE(at::equal(ours.grad, ref.grad));  // zeros
  at::NoGradGuard no_grad;
  const at::Tensor targets = targets_for(6, 10);
  EXPECT_LE(scaled_error(fused(logits, targets), exact(logits.to(at::kDouble), targets)), 1e-6);
}

TEST(CrossEntropyKernel, RefusesATargetOutOfRange) {
  const at::Tensor logits = at::randn({3, 5});
  for (const int64_t bad : {5, -1, -101}) {
    const at::Tensor targets = at::tensor(std::vector<int64_t>{0, bad, 2});
    try {
      fused(logits, targets);
      ADD_FAILURE() << "no error for target " << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("of row 1 is outside [0, 5)"), std::string::npos) << e.what();
    }
  }
}

TEST(CrossEntropyKernel, TheKernelsPluginServesIt) {
  ComponentRegistry registry;
  PluginLoader(registry).load_search_path({STRATA_KERNELS_PLUGIN});
  OperatorTable::global().install(registry);
  const at::Tensor logits = at::randn({4, 6});
  EXPECT_EQ(ops::select("cross_entropy", logits).name(), "cross_entropy.fused_cpu");
  EXPECT_EQ(ops::select("cross_entropy", logits.to(at::kBFloat16)).name(), "cross_entropy.fused_cpu");
  EXPECT_EQ(ops::select("cross_entropy", logits.to(at::kDouble)).name(), "cross_entropy.reference");
  // A call the kernel does not take (double logits) goes to the reference.
  const at::Tensor targets = at::tensor(std::vector<int64_t>{1, 2, 3, 4});
  EXPECT_TRUE(at::equal(kernels::cross_entropy_fused_cpu(logits.to(at::kDouble), targets),
                        at::cross_entropy_loss(logits.to(at::kDouble).to(at::kFloat), targets)));
  OperatorTable::global().reset();
}

}  // namespace
}  // namespace strata
