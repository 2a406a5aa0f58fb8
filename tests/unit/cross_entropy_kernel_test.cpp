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
#include "../cross_entropy_cases.h"
#include "../elementwise_error.h"

namespace strata {
namespace {

using testing::scaled_error;

using testing::exact_cross_entropy;
using testing::loss_and_grad;
using testing::LossAndGrad;
using testing::targets_for;

at::Tensor fused(const at::Tensor& logits, const at::Tensor& targets) { return kernels::cross_entropy_fused_cpu(logits, targets); }
at::Tensor reference(const at::Tensor& logits, const at::Tensor& targets) {
  return at::cross_entropy_loss(logits.to(at::kFloat), targets);
}

TEST(CrossEntropyKernel, MatchesTheReferenceAndTheFormula) {
  at::manual_seed(0);
  for (const auto& [rows, vocab] : std::vector<std::array<int64_t, 2>>{{1, 1}, {3, 7}, {5, 8}, {17, 9}, {33, 100}, {300, 33}, {64, 4099}}) {
    const at::Tensor logits = at::randn({rows, vocab}) * 3, targets = targets_for(rows, vocab);
    const LossAndGrad ours = loss_and_grad(fused, logits, targets), ref = loss_and_grad(reference, logits, targets);
    const LossAndGrad formula = loss_and_grad(exact_cross_entropy, logits.to(at::kDouble), targets);
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
    const LossAndGrad ours = loss_and_grad(fused, logits, targets), ref = loss_and_grad(reference, logits, targets);
    EXPECT_EQ(ours.grad.scalar_type(), dtype);
    EXPECT_LE(scaled_error(ours.loss, ref.loss), 1e-6) << c10::toString(dtype);
    // The same fp32 values rounded once to the dtype: at most one rounding apart.
    EXPECT_LE(scaled_error(ours.grad, ref.grad), dtype == at::kBFloat16 ? 8e-3 : 1e-3) << c10::toString(dtype);
  }
}

TEST(CrossEntropyKernel, HalfLogitsUnderLossScalingRoundOnceAfterScaling) {
  testing::expect_half_loss_scaling_rounds_once(fused, reference, at::kCPU);
}

TEST(CrossEntropyKernel, ScalesByTheIncomingGradient) {
  at::manual_seed(2);
  const at::Tensor logits = at::randn({40, 50}), targets = targets_for(40, 50);
  for (const double scale : {0.5, -3.0, 0.0}) {
    const LossAndGrad ours = loss_and_grad(fused, logits, targets, scale);
    const LossAndGrad ref = loss_and_grad(exact_cross_entropy, logits.to(at::kDouble), targets, scale);
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
  const LossAndGrad ours = loss_and_grad(fused, logits, ignored), ref = loss_and_grad(reference, logits, ignored);
  EXPECT_TRUE(std::isnan(ours.loss.item<float>()) && std::isnan(ref.loss.item<float>()));
  EXPECT_TRUE(at::equal(ours.grad, ref.grad));  // zeros
  at::NoGradGuard no_grad;
  const at::Tensor targets = targets_for(6, 10);
  EXPECT_LE(scaled_error(fused(logits, targets), exact_cross_entropy(logits.to(at::kDouble), targets)), 1e-6);
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
