// The fp8 pass's numerics (plugins/fp8) against references written from the formulas of
// docs/fp8.md: quantization (scale, saturate, round to nearest even) in both formats, the amax
// history and scale update of delayed scaling, and the fp8 Linear's forward and backward.
#include <algorithm>
#include <cmath>
#include <limits>

#include <iostream>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "fp8_linear.h"
#include "fp8_numerics.h"
#include "fp8_rowwise.h"

namespace strata::fp8 {
namespace {

// The value a float rounds to in a float8 format with `mantissa` bits, exponent bias `bias` and
// largest finite value `max`, written from the definition: round to nearest even on the grid
// of the value's binade (subnormals share the smallest binade's spacing), saturated to +-max.
double reference_round(double x, int mantissa, int bias, double max) {
  if (x == 0) return 0;
  const double sign = x < 0 ? -1 : 1;
  double a = std::fabs(x);
  if (a >= max) return sign * max;  // saturation (the cast itself would give NaN or inf)
  int exponent = static_cast<int>(std::floor(std::log2(a)));
  exponent = std::max(exponent, 1 - bias);  // subnormals: the spacing of the smallest normal binade
  const double spacing = std::ldexp(1.0, exponent - mantissa);
  const double steps = a / spacing;
  double lower = std::floor(steps);
  const double fraction = steps - lower;
  if (fraction > 0.5 || (fraction == 0.5 && std::fmod(lower, 2.0) == 1.0)) lower += 1;
  return sign * std::min(lower * spacing, max);
}

double reference(double x, Format f) {
  return f == Format::E4M3 ? reference_round(x, 3, 7, 448.0) : reference_round(x, 2, 15, 57344.0);
}

at::Tensor scalar(double v) { return at::full({}, v, at::kFloat); }

TEST(Fp8Quantize, MatchesTheFormulaInBothFormats) {
  torch::manual_seed(0);
  // Values across the range, ties of both parities, subnormals and beyond-range values.
  at::Tensor x = at::cat({at::randn({4000}) * 100, at::randn({1000}) * 1e-3, at::randn({200}) * 1e5,
                          at::tensor({1.0625f, 1.1875f, 464.0f, 500.0f, -1e6f, 0.0f, 61440.0f, -7e4f})});
  for (Format f : {Format::E4M3, Format::E5M2})
    for (double scale : {1.0, 0.25, 3.0}) {
      const at::Tensor q = quantize(x, scalar(scale), f).to(at::kFloat);
      ASSERT_EQ(q.scalar_type(), at::kFloat);
      const auto xs = x.accessor<float, 1>();
      const auto qs = q.accessor<float, 1>();
      for (int64_t i = 0; i < x.numel(); ++i) {
        // The product is rounded to fp32 first, as the pass computes it.
        const double scaled = static_cast<double>(static_cast<float>(xs[i] * static_cast<float>(scale)));
        ASSERT_EQ(qs[i], reference(scaled, f)) << "x = " << xs[i] << " scale " << scale << " format " << static_cast<int>(f);
      }
    }
}

TEST(Fp8Quantize, SaturatesInsteadOfOverflowing) {
  const at::Tensor x = at::tensor({1e9f, -1e9f, 449.0f, 57345.0f});
  EXPECT_TRUE(at::equal(quantize(x, scalar(1), Format::E4M3).to(at::kFloat), at::tensor({448.0f, -448.0f, 448.0f, 448.0f})));
  EXPECT_TRUE(at::equal(quantize(x, scalar(1), Format::E5M2).to(at::kFloat), at::tensor({57344.0f, -57344.0f, 448.0f, 57344.0f})));
  EXPECT_EQ(quantize(x, scalar(1), Format::E4M3).scalar_type(), at::kFloat8_e4m3fn);
  EXPECT_EQ(quantize(x, scalar(1), Format::E5M2).scalar_type(), at::kFloat8_e5m2);
}

TEST(Fp8Scale, FollowsTheFormulaAndKeepsThePreviousScaleForZeroAmax) {
  const at::Tensor amax = at::tensor({2.0f, 0.0f, 448.0f, std::numeric_limits<float>::infinity()});
  const at::Tensor max = at::tensor({448.0f, 448.0f, 57344.0f, 448.0f});
  const at::Tensor previous = at::tensor({5.0f, 7.0f, 9.0f, 11.0f});
  EXPECT_TRUE(at::allclose(scale_from_amax(amax, max, 0, previous), at::tensor({224.0f, 7.0f, 128.0f, 11.0f})));
  EXPECT_TRUE(at::allclose(scale_from_amax(amax, max, 2, previous), at::tensor({56.0f, 7.0f, 32.0f, 11.0f})));
}

TEST(Fp8DelayedScaling, HistoryRollsAndScalesFollowMaxOrMostRecent) {
  // Two tensors, a history of 3 steps.
  DelayedScaling d(2, 3, at::tensor({448.0f, 57344.0f}), at::Device(at::kCPU));
  EXPECT_TRUE(at::equal(d.scale, at::ones({2})));
  const std::vector<std::pair<float, float>> steps{{1, 8}, {4, 2}, {2, 0}, {0.5f, 0}};
  std::vector<at::Tensor> scales_max, scales_recent;
  for (const auto& [a, b] : steps) {
    d.observe(0, scalar(a / 2));  // two micro-batches: the step's amax is their max
    d.observe(0, scalar(a));
    d.observe(1, scalar(b));
    d.roll();
    EXPECT_TRUE(at::equal(d.pending, at::zeros({2})));
    DelayedScaling copy = d;
    copy.scale = d.scale.clone();
    copy.update_scales(/*use_max=*/false, 0);
    scales_recent.push_back(copy.scale.clone());
    d.update_scales(/*use_max=*/true, 0);
    scales_max.push_back(d.scale.clone());
  }
  // Newest first, the oldest step dropped after 3.
  EXPECT_TRUE(at::equal(d.history, at::tensor({0.5f, 2.0f, 4.0f, 0.0f, 0.0f, 2.0f}).reshape({2, 3})));
  // max over the window: tensor 0 sees 1, 4, 4, 4; tensor 1 sees 8, 8, 8, then 2 (8 left the window).
  EXPECT_TRUE(at::allclose(scales_max[0], at::tensor({448.0f, 57344.0f / 8})));
  EXPECT_TRUE(at::allclose(scales_max[2], at::tensor({448.0f / 4, 57344.0f / 8})));
  EXPECT_TRUE(at::allclose(scales_max[3], at::tensor({448.0f / 4, 57344.0f / 2})));
  // most_recent (from the scales max left): tensor 0 follows each step; tensor 1's zero amaxes
  // keep the previous scale.
  EXPECT_TRUE(at::allclose(scales_recent[2], at::tensor({448.0f / 2, 57344.0f / 8})));
  EXPECT_TRUE(at::allclose(scales_recent[3], at::tensor({448.0f / 0.5f, 57344.0f / 8})));
}

TEST(Fp8DelayedScaling, MarginAndNonFiniteAmax) {
  DelayedScaling d(1, 4, at::tensor({448.0f}), at::Device(at::kCPU));
  d.observe(0, scalar(7));
  d.roll();
  d.update_scales(true, 3);
  EXPECT_FLOAT_EQ(d.scale.item<float>(), 448.0f / 7 / 8);
  d.observe(0, scalar(std::numeric_limits<float>::quiet_NaN()));
  d.roll();  // recorded as 0: the history keeps its finite max
  EXPECT_EQ(d.history[0][0].item<float>(), 0.0f);
  d.update_scales(true, 3);
  EXPECT_FLOAT_EQ(d.scale.item<float>(), 448.0f / 7 / 8);
}

TEST(Fp8DelayedScaling, IntervalIsTheCallersStepRule) {
  // The pass updates scales when step % interval == 0; between updates the scale stays.
  DelayedScaling d(1, 8, at::tensor({448.0f}), at::Device(at::kCPU));
  const int64_t interval = 3;
  std::vector<float> seen;
  for (int64_t step = 1; step <= 6; ++step) {
    d.observe(0, scalar(static_cast<float>(step)));
    d.roll();
    if (step % interval == 0) d.update_scales(false, 0);
    seen.push_back(d.scale.item<float>());
  }
  EXPECT_EQ(seen, (std::vector<float>{1, 1, 448.0f / 3, 448.0f / 3, 448.0f / 3, 448.0f / 6}));
}

// Forward and backward of the fp8 Linear against float references: on the dequantized fp8
// operands (tight: only the order of fp32 sums differs) and on the original fp32 values (loose:
// fp8's rounding).
struct LinearCase {
  at::Tensor x, w, b, dy;
};

LinearCase make_case() {
  torch::manual_seed(1);
  return {at::randn({2, 24, 64}), at::randn({48, 64}) * 0.1, at::randn({48}) * 0.1, at::randn({2, 24, 48}) * 1e-3};
}

TEST(Fp8Linear, ForwardAndBackwardMatchTheDequantizedReference) {
  for (Recipe recipe : {Recipe::Current, Recipe::Delayed}) {
    const LinearCase c = make_case();
    Scaling scaling;
    scaling.recipe = recipe;
    if (recipe == Recipe::Delayed) {
      scaling.delayed = std::make_shared<DelayedScaling>(3, 16, at::tensor({448.0f, 448.0f, 57344.0f}), at::Device(at::kCPU));
      // Scales as a step would have left them, from these very tensors' amaxes.
      scaling.delayed->observe(0, abs_max(c.x));
      scaling.delayed->observe(1, abs_max(c.w));
      scaling.delayed->observe(2, abs_max(c.dy));
      scaling.delayed->roll();
      scaling.delayed->update_scales(true, 0);
    }
    at::Tensor x = c.x.clone().requires_grad_(), w = c.w.clone().requires_grad_(), b = c.b.clone().requires_grad_();
    at::Tensor y = fp8_linear(x, w, b, scaling, 0, at::kFloat);
    y.backward(c.dy);

    // The reference: scales from the formula, operands quantized and dequantized, fp32 math.
    auto s = [](const at::Tensor& t, double max) { return scalar(max / abs_max(t).item<float>()); };
    const at::Tensor sx = s(c.x, 448), sw = s(c.w, 448), sg = s(c.dy, 57344);
    const at::Tensor xd = quantize(c.x, sx, Format::E4M3).to(at::kFloat) / sx;
    const at::Tensor wd = quantize(c.w, sw, Format::E4M3).to(at::kFloat) / sw;
    const at::Tensor gd = quantize(c.dy, sg, Format::E5M2).to(at::kFloat) / sg;
    const at::Tensor y_ref = at::matmul(xd, wd.t()) + c.b;
    const at::Tensor dx_ref = at::matmul(gd, wd);
    const at::Tensor dw_ref = at::matmul(gd.reshape({-1, 48}).t(), xd.reshape({-1, 64}));
    const at::Tensor db_ref = c.dy.reshape({-1, 48}).sum(0);
    // Within 1e-6 of the result's largest magnitude: only the order of the fp32 sums differs.
    auto close = [](const at::Tensor& a, const at::Tensor& ref) {
      return (a - ref).abs().max().item<double>() <= 1e-6 * ref.abs().max().item<double>();
    };
    EXPECT_TRUE(close(y, y_ref)) << (y - y_ref).abs().max();
    EXPECT_TRUE(close(x.grad(), dx_ref)) << (x.grad() - dx_ref).abs().max();
    EXPECT_TRUE(close(w.grad(), dw_ref)) << (w.grad() - dw_ref).abs().max();
    EXPECT_TRUE(close(b.grad(), db_ref));

    // Against plain fp32: fp8's relative rounding (E4M3 2^-4, E5M2 2^-3 per operand) averages
    // out in the sums; a few percent of the result's scale.
    at::Tensor x32 = c.x.clone().requires_grad_(), w32 = c.w.clone().requires_grad_();
    at::Tensor y32 = at::linear(x32, w32, c.b);
    y32.backward(c.dy);
    auto relative = [](const at::Tensor& a, const at::Tensor& ref) { return ((a - ref).norm() / ref.norm()).item<double>(); };
    EXPECT_LT(relative(y, y32), 0.05);
    EXPECT_LT(relative(x.grad(), x32.grad()), 0.1);
    EXPECT_LT(relative(w.grad(), w32.grad()), 0.1);
    std::cout << "fp8 vs fp32 relative error (recipe " << (recipe == Recipe::Delayed ? "delayed" : "current") << "): y "
              << relative(y, y32) << ", dx " << relative(x.grad(), x32.grad()) << ", dw " << relative(w.grad(), w32.grad()) << "\n";
  }
}

// Row-wise: each operand quantized along each GEMM's contracted dimension with one scale per row
// (or column), dequantized and multiplied in fp32 (fp8_rowwise.h's table).
TEST(Fp8Rowwise, ForwardAndBackwardMatchTheDequantizedReference) {
  LinearCase c = make_case();
  // Outliers in one token and one input feature: a tensorwise scale would flatten the rest.
  c.x.select(1, 3).mul_(300);
  c.x.select(2, 5).mul_(50);
  c.x.select(1, 7).zero_();  // an all-zero token keeps scale 1
  for (Format backward : {Format::E5M2, Format::E4M3})
    for (int64_t margin : {0, 2}) {
      RowwiseScaling scaling;
      scaling.backward = backward;
      scaling.margin = margin;
      at::Tensor x = c.x.clone().requires_grad_(), w = c.w.clone().requires_grad_(), b = c.b.clone().requires_grad_();
      at::Tensor y = fp8_linear_rowwise(x, w, b, scaling, at::kFloat);
      y.backward(c.dy);

      // Reference: the scales of each slice from the formula, each operand dequantized per GEMM.
      const double unit = std::ldexp(1.0, static_cast<int>(margin));
      auto dequantized = [&](const at::Tensor& t, int64_t dim, Format f) {
        const double max = f == Format::E4M3 ? 448.0 : 57344.0;
        at::Tensor amax = t.abs().amax({dim}, true);
        at::Tensor scale = at::where(amax.gt(0), max / amax / unit, at::ones_like(amax));
        return quantize(t, scale, f).to(at::kFloat) / scale;
      };
      const at::Tensor x2 = c.x.reshape({-1, 64}), g = c.dy.reshape({-1, 48});
      const at::Tensor y_ref = at::matmul(dequantized(x2, 1, Format::E4M3), dequantized(c.w, 1, Format::E4M3).t()) + c.b;
      const at::Tensor dx_ref = at::matmul(dequantized(g, 1, backward), dequantized(c.w, 0, Format::E4M3));
      const at::Tensor dw_ref = at::matmul(dequantized(g, 0, backward).t(), dequantized(x2, 0, Format::E4M3));
      auto close = [](const at::Tensor& a, const at::Tensor& ref) {
        return (a - ref).abs().max().item<double>() <= 1e-6 * ref.abs().max().item<double>();
      };
      EXPECT_TRUE(close(y.reshape({-1, 48}), y_ref)) << (y.reshape({-1, 48}) - y_ref).abs().max();
      EXPECT_TRUE(close(x.grad().reshape({-1, 64}), dx_ref)) << (x.grad().reshape({-1, 64}) - dx_ref).abs().max();
      EXPECT_TRUE(close(w.grad(), dw_ref)) << (w.grad() - dw_ref).abs().max();
      EXPECT_TRUE(close(b.grad(), c.dy.reshape({-1, 48}).sum(0)));
    }
}

// With outliers, row-wise scales keep the other rows precise where one tensorwise scale cannot.
TEST(Fp8Rowwise, MorePreciseThanTensorwiseWithOutliers) {
  LinearCase c = make_case();
  c.x.select(1, 3).mul_(1e5);  // beyond E4M3's normal range (448 / 2^-6) above the other tokens
  auto error = [&](bool rowwise) {
    at::Tensor x = c.x.clone().requires_grad_(), w = c.w.clone().requires_grad_();
    Scaling current;
    current.recipe = Recipe::Current;
    const at::Tensor y = rowwise ? fp8_linear_rowwise(x, w, std::nullopt, RowwiseScaling{}, at::kFloat)
                                 : fp8_linear(x, w, std::nullopt, current, 0, at::kFloat);
    const at::Tensor ref = at::linear(c.x, c.w);
    // The rows without the outlier.
    const at::Tensor keep = at::arange(24).ne(3);
    const at::Tensor a = y.index({at::indexing::Slice(), keep}), r = ref.index({at::indexing::Slice(), keep});
    return ((a - r).norm() / r.norm()).item<double>();
  };
  const double rowwise = error(true), tensorwise = error(false);
  std::cout << "relative error of the rows without the outlier: rowwise " << rowwise << ", tensorwise " << tensorwise << "\n";
  EXPECT_LT(rowwise, 0.05);
  EXPECT_LT(rowwise * 4, tensorwise);
}

TEST(Fp8Rowwise, OutputDtypeAndBf16Inputs) {
  const LinearCase c = make_case();
  at::Tensor x = c.x.to(at::kBFloat16).requires_grad_();
  at::Tensor w = c.w.clone().requires_grad_();
  at::Tensor y = fp8_linear_rowwise(x, w, std::nullopt, RowwiseScaling{}, at::kBFloat16);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  y.backward(c.dy.to(at::kBFloat16));
  EXPECT_EQ(x.grad().scalar_type(), at::kBFloat16);
  EXPECT_EQ(w.grad().scalar_type(), at::kFloat);
}

// Before its first scale update the delayed recipe has no history: it scales each tensor by its
// own amax (the current recipe's scales), then by the history's.
TEST(Fp8Linear, DelayedScalesByOwnAmaxUntilTheFirstUpdate) {
  const LinearCase c = make_case();
  auto run = [&](Scaling& scaling) {
    at::Tensor x = c.x.clone().requires_grad_(), w = c.w.clone().requires_grad_();
    at::Tensor y = fp8_linear(x, w, c.b, scaling, 0, at::kFloat);
    y.backward(c.dy);
    return std::vector<at::Tensor>{y, x.grad(), w.grad()};
  };
  Scaling current;
  current.recipe = Recipe::Current;
  Scaling delayed;
  delayed.delayed = std::make_shared<DelayedScaling>(3, 4, at::tensor({448.0f, 448.0f, 57344.0f}), at::Device(at::kCPU));
  const auto expected = run(current), first = run(delayed);
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_TRUE(at::equal(first[i], expected[i])) << i;
  EXPECT_FALSE(delayed.delayed->updated);
  // The history then holds a 4x larger amax for the input: its scale is a quarter of its own.
  delayed.delayed->observe(0, abs_max(c.x) * 4);
  delayed.delayed->roll();
  delayed.delayed->update_scales(true, 0);
  EXPECT_TRUE(delayed.delayed->updated);
  EXPECT_FLOAT_EQ(delayed.delayed->scale[0].item<float>(), 448.0f / (4 * abs_max(c.x).item<float>()));
  EXPECT_FALSE(at::equal(run(delayed)[0], expected[0]));
}

TEST(Fp8Linear, OutputDtypeAndBf16Inputs) {
  const LinearCase c = make_case();
  Scaling scaling;
  scaling.recipe = Recipe::Current;
  at::Tensor x = c.x.to(at::kBFloat16).requires_grad_();
  at::Tensor w = c.w.clone().requires_grad_();
  at::Tensor y = fp8_linear(x, w, std::nullopt, scaling, 0, at::kBFloat16);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  y.backward(c.dy.to(at::kBFloat16));
  EXPECT_EQ(x.grad().scalar_type(), at::kBFloat16);  // gradients in their tensors' own dtypes
  EXPECT_EQ(w.grad().scalar_type(), at::kFloat);
}

TEST(Fp8Linear, EvaluationRecordsNoAmax) {
  const LinearCase c = make_case();
  Scaling scaling;
  scaling.delayed = std::make_shared<DelayedScaling>(3, 4, at::tensor({448.0f, 448.0f, 57344.0f}), at::Device(at::kCPU));
  scaling.evaluating = true;
  at::NoGradGuard no_grad;
  fp8_linear(c.x, c.w, c.b, scaling, 0, at::kFloat);
  EXPECT_TRUE(at::equal(scaling.delayed->pending, at::zeros({3})));
  scaling.evaluating = false;
  const at::Tensor first = fp8_linear(c.x, c.w, c.b, scaling, 0, at::kFloat);
  EXPECT_FLOAT_EQ(scaling.delayed->pending[0].item<float>(), abs_max(c.x).item<float>());
  // A second forward of the same values (an activation-checkpointing recomputation) changes
  // neither the recorded amax nor the output.
  const at::Tensor second = fp8_linear(c.x, c.w, c.b, scaling, 0, at::kFloat);
  EXPECT_TRUE(at::equal(first, second));
  EXPECT_FLOAT_EQ(scaling.delayed->pending[0].item<float>(), abs_max(c.x).item<float>());
}

}  // namespace
}  // namespace strata::fp8
