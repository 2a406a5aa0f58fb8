// linear.onednn_cpu (kernels/cpu/linear_onednn.cpp) against the fp64 formula and against core's
// reference (at::linear): values and the three gradients at shapes that are and are not
// multiples of oneDNN's blocks, with and without a bias, 3-D and non-contiguous inputs, frozen
// inputs and weights, bf16 and fp16 (as operands and under autocast), what it leaves to
// at::linear, and the table choosing it.
#include <algorithm>
#include <array>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "cpu/linear_onednn.h"
#include "strata/core/cpu_features.h"
#include "strata/core/component_registry.h"
#include "strata/core/operator_table.h"
#include "strata/core/plugin_loader.h"
#include "strata/ops.h"
#include "../elementwise_error.h"

namespace strata {
namespace {

using testing::scaled_error;

struct Grads {
  at::Tensor y, dx, dw, db;
};

template <class Fn>
Grads run(Fn fn, const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& b0, const at::Tensor& dy) {
  at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
  at::Tensor b = b0.defined() ? b0.clone().requires_grad_(true) : at::Tensor();
  const at::Tensor y = fn(x, w, b.defined() ? std::optional<at::Tensor>(b) : std::nullopt);
  std::vector<at::Tensor> inputs{x, w};
  if (b.defined()) inputs.push_back(b);
  const auto g = torch::autograd::grad({y}, inputs, {dy});
  return {y.detach(), g[0], g[1], b.defined() ? g[2] : at::Tensor()};
}

at::Tensor onednn(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b) {
  return kernels::linear_onednn_cpu(x, w, b);
}
at::Tensor reference(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b) {
  return at::linear(x, w, b);
}

TEST(LinearOnednn, MatchesTheFormulaAndTheReference) {
  if (!kernels::onednn_linear_chosen()) GTEST_SKIP() << "oneDNN's linear does not serve here (strata ops says why)";
  struct Shape {
    std::vector<int64_t> x;  // [..., in]
    int64_t out;
  };
  const Shape shapes[] = {{{1, 1}, 1}, {{7, 5}, 3}, {{33, 17}, 65}, {{2, 9, 31}, 16}, {{4, 64, 384}, 1152}, {{300, 128}, 257}};
  for (const Shape& s : shapes) {
    for (const bool with_bias : {true, false}) {
      at::manual_seed(s.out + s.x.back());
      const int64_t in = s.x.back();
      const at::Tensor x = at::randn(s.x), w = at::randn({s.out, in}) / std::sqrt(double(in));
      const at::Tensor b = with_bias ? at::randn({s.out}) : at::Tensor();
      std::vector<int64_t> y_shape = s.x;
      y_shape.back() = s.out;
      const at::Tensor dy = at::randn(y_shape);
      const Grads ours = run(onednn, x, w, b, dy), ref = run(reference, x, w, b, dy);
      const Grads exact = run(reference, x.to(at::kDouble), w.to(at::kDouble), with_bias ? b.to(at::kDouble) : b, dy.to(at::kDouble));
      const std::string where = "x " + c10::str(s.x) + " out " + std::to_string(s.out) + (with_bias ? " bias" : "");
      ASSERT_EQ(ours.y.sizes(), ref.y.sizes()) << where;
      EXPECT_EQ(ours.y.scalar_type(), at::kFloat) << where;
      for (const auto& [name, a, r, e] : {std::tuple{"y", ours.y, ref.y, exact.y}, std::tuple{"dx", ours.dx, ref.dx, exact.dx},
                                         std::tuple{"dw", ours.dw, ref.dw, exact.dw}}) {
        EXPECT_LE(scaled_error(a, e), 2e-6) << where << " " << name << " vs fp64";
        EXPECT_LE(scaled_error(a, r), 2e-6) << where << " " << name << " vs at::linear";
      }
      if (with_bias) EXPECT_LE(scaled_error(ours.db, exact.db), 2e-6) << where;
    }
  }
}

TEST(LinearOnednn, TakesNonContiguousInputsAndWeights) {
  if (!kernels::onednn_linear_chosen()) GTEST_SKIP() << "oneDNN's linear does not serve here (strata ops says why)";
  at::manual_seed(1);
  const at::Tensor x = at::randn({48, 3, 40}).transpose(0, 1);  // [3, 48, 40], strided
  const at::Tensor w = at::randn({40, 24}).t();                 // [24, 40], a transposed view
  const at::Tensor dy = at::randn({3, 48, 24});
  at::Tensor xg = x.detach().requires_grad_(true), wg = w.detach().requires_grad_(true);
  const at::Tensor y = onednn(xg, wg, std::nullopt);
  const auto g = torch::autograd::grad({y}, {xg, wg}, {dy});
  const Grads exact = run(reference, x.to(at::kDouble), w.to(at::kDouble), at::Tensor(), dy.to(at::kDouble));
  EXPECT_LE(scaled_error(y, exact.y), 2e-6);
  EXPECT_LE(scaled_error(g[0], exact.dx), 2e-6);
  EXPECT_LE(scaled_error(g[1], exact.dw), 2e-6);
}

// Whichever path serves here (oneDNN's matmul; MKL on a CPU without AVX-512 or under
// STRATA_CPU_FALLBACK, which a ctest entry sets so that both are proven on every machine).
TEST(LinearOnednn, WeightGradientOnThePathThisCpuRuns) {
  // torch 2.11.0's libtorch_cpu exports oneDNN's matmul: where the CPU can run it, a silent fall
  // back to at::mm would lose the speed; where it cannot, calling it would throw.
  const CpuFeatures& cpu = cpu_features();
  const bool chosen = kernels::onednn_matmul_chosen();  // decided (and recorded) by the first call
  const bool runnable = at::hasMKLDNN() && (cpu.avx512 || cpu.avx_ne_convert) && cpu.onednn_max_isa.empty();
  if (cpu.onednn_max_isa.empty() || cpu_fallback_forced("onednn_matmul"))
    EXPECT_EQ(chosen, runnable && !cpu_fallback_forced("onednn_matmul")) << cpu_features_line();
  const auto paths = cpu_paths();
  const auto recorded = std::find_if(paths.begin(), paths.end(), [](const CpuPathChoice& c) { return c.path == "onednn_matmul"; });
  ASSERT_NE(recorded, paths.end());
  EXPECT_EQ(recorded->fast, chosen);
  EXPECT_FALSE(recorded->why.empty());
  at::manual_seed(4);
  for (const auto& [n, out, in] : std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {37, 5, 19}, {256, 48, 17}, {130, 129, 64}}) {
    const at::Tensor dy = at::randn({n, out}), rows = at::randn({n, in});
    const at::Tensor exact = dy.to(at::kDouble).t().mm(rows.to(at::kDouble));
    EXPECT_LE(scaled_error(kernels::linear_weight_gradient(dy, rows), exact), 2e-6) << n << " x " << out << " x " << in;
    // Strided operands (a column slice, a transposed copy's view) read as they are.
    const at::Tensor wide = at::randn({n, out + 3}), rows_t = at::randn({in, n}).t();
    const at::Tensor dy_view = wide.slice(1, 1, out + 1);
    EXPECT_LE(scaled_error(kernels::linear_weight_gradient(dy_view, rows_t),
                           dy_view.to(at::kDouble).t().mm(rows_t.to(at::kDouble))),
              2e-6);
  }
}

TEST(LinearOnednn, ComputesOnlyTheGradientsAskedFor) {
  if (!kernels::onednn_linear_chosen()) GTEST_SKIP() << "oneDNN's linear does not serve here (strata ops says why)";
  at::manual_seed(2);
  const at::Tensor x = at::randn({9, 12}), w = at::randn({5, 12}).requires_grad_(true), b = at::randn({5});
  const at::Tensor y = onednn(x, w, b);  // x and b frozen (an embedding's output, a frozen bias)
  const at::Tensor dw = torch::autograd::grad({y.sum()}, {w})[0];
  EXPECT_LE(scaled_error(dw, at::ones({9, 5}).t().mm(x)), 2e-6);
  const at::Tensor frozen = at::randn({5, 12});  // a frozen weight: only dx
  at::Tensor xg = x.clone().requires_grad_(true);
  const at::Tensor dx = torch::autograd::grad({onednn(xg, frozen, std::nullopt).sum()}, {xg})[0];
  EXPECT_LE(scaled_error(dx, at::ones({9, 5}).mm(frozen)), 2e-6);
  at::NoGradGuard no_grad;  // inference: no autograd node at all
  EXPECT_LE(scaled_error(onednn(x, frozen, b), at::linear(x, frozen, b)), 2e-6);
}

TEST(LinearOnednn, LeavesOtherDtypesAndUnchosenPathsToAtLinear) {
  at::manual_seed(3);
  const at::Tensor x = at::randn({6, 8}), w = at::randn({4, 8});
  for (const at::ScalarType dtype : {at::kDouble, at::kBFloat16, at::kHalf}) {
    if (dtype != at::kDouble && kernels::half_gemms_via_fp32(dtype)) continue;  // HalfPrecision... below
    EXPECT_TRUE(at::equal(onednn(x.to(dtype), w.to(dtype), std::nullopt), at::linear(x.to(dtype), w.to(dtype))))
        << c10::toString(dtype);
  }
  EXPECT_TRUE(at::equal(onednn(x.slice(0, 0, 0), w, std::nullopt), at::linear(x.slice(0, 0, 0), w)));  // no rows
  EXPECT_TRUE(at::equal(onednn(x, w.slice(0, 0, 0), std::nullopt), at::linear(x, w.slice(0, 0, 0))));  // no outputs
  if (!kernels::half_gemms_via_fp32(at::kBFloat16)) {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    const at::Tensor ours = onednn(x, w, std::nullopt), ref = at::linear(x, w);
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::clear_cache();
    EXPECT_EQ(ours.scalar_type(), at::kBFloat16);
    EXPECT_TRUE(at::equal(ours, ref));
  }
}

// bf16 and fp16 where ATen's oneDNN has no GEMM in that type: fp32 GEMMs on the widened operands,
// each result rounded once. Against the fp64 formula on the same half-precision values: within
// one unit in the last place of the largest value (rounding is half of one; the fp32 sums add
// little), for the output and all three gradients, in the half type as at::linear returns them.
// Under STRATA_CPU_FALLBACK (kernels.forced_cpu_fallbacks) at::linear serves, bit for bit.
TEST(LinearOnednn, HalfPrecisionIsAHalfGemmWithFp32Sums) {
  const CpuFeatures& cpu = cpu_features();
  for (const auto& [dtype, ulp] : std::vector<std::pair<at::ScalarType, double>>{{at::kBFloat16, 1.0 / 256}, {at::kHalf, 1.0 / 2048}}) {
    const std::string type = dtype == at::kBFloat16 ? "bf16" : "fp16";
    const bool chosen = kernels::half_gemms_via_fp32(dtype);
    // A CPU without any of what oneDNN's half GEMMs need: ATen's would be scalar, so ours serves.
    if (!cpu.avx512 && !cpu.avx_ne_convert && !cpu.amx_bf16 && !cpu.amx_fp16)
      EXPECT_EQ(chosen, !cpu_fallback_forced(type + "_gemm_via_fp32")) << cpu_features_line();
    at::manual_seed(5);
    for (const auto& [n, out, in] : std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {37, 5, 19}, {130, 129, 64}}) {
      for (const bool with_bias : {true, false}) {
        const at::Tensor x = at::randn({2, n, in}).to(dtype), w = at::randn({out, in}).to(dtype), dy = at::randn({2, n, out}).to(dtype);
        const at::Tensor b = with_bias ? at::randn({out}).to(dtype) : at::Tensor();
        const Grads ours = run(onednn, x, w, b, dy), aten = run(reference, x, w, b, dy);
        const at::Tensor xd = x.to(at::kDouble), wd = w.to(at::kDouble), dyd = dy.to(at::kDouble);
        at::Tensor y = at::matmul(xd, wd.t());
        if (with_bias) y = y + b.to(at::kDouble);
        const std::string where = type + " " + std::to_string(n) + " x " + std::to_string(out) + " x " + std::to_string(in);
        EXPECT_EQ(ours.y.scalar_type(), aten.y.scalar_type()) << where;
        EXPECT_EQ(ours.dw.scalar_type(), aten.dw.scalar_type()) << where;
        EXPECT_LE(scaled_error(ours.y, y), ulp) << where;
        EXPECT_LE(scaled_error(ours.dx, at::matmul(dyd, wd)), ulp) << where;
        EXPECT_LE(scaled_error(ours.dw, dyd.reshape({-1, out}).t().mm(xd.reshape({-1, in}))), ulp) << where;
        if (with_bias) EXPECT_LE(scaled_error(ours.db, dyd.reshape({-1, out}).sum(0)), ulp) << where;
        if (!chosen) EXPECT_TRUE(at::equal(ours.y, aten.y) && at::equal(ours.dx, aten.dx) && at::equal(ours.dw, aten.dw)) << where;
      }
    }
  }
}

// Under CPU autocast (amp): fp32 master weights and inputs, autocast's casts, a bf16 output and
// fp32 gradients, as at::linear under autocast gives them.
TEST(LinearOnednn, HalfPrecisionUnderAutocast) {
  at::manual_seed(6);
  const at::Tensor x = at::randn({3, 17, 40}), w = at::randn({24, 40}), b = at::randn({24}), dy = at::randn({3, 17, 24}).to(at::kBFloat16);
  at::autocast::set_autocast_enabled(at::kCPU, true);
  at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
  const Grads ours = run(onednn, x, w, b, dy), aten = run(reference, x, w, b, dy);
  at::autocast::set_autocast_enabled(at::kCPU, false);
  at::autocast::clear_cache();
  EXPECT_EQ(ours.y.scalar_type(), at::kBFloat16);
  EXPECT_EQ(aten.y.scalar_type(), at::kBFloat16);
  for (const at::Tensor& g : {ours.dx, ours.dw, ours.db}) EXPECT_EQ(g.scalar_type(), at::kFloat);
  const at::Tensor x16 = x.to(at::kBFloat16).to(at::kDouble), w16 = w.to(at::kBFloat16).to(at::kDouble), dyd = dy.to(at::kDouble);
  const double ulp = 1.0 / 256;
  EXPECT_LE(scaled_error(ours.y, at::matmul(x16, w16.t()) + b.to(at::kBFloat16).to(at::kDouble)), ulp);
  EXPECT_LE(scaled_error(ours.dx, at::matmul(dyd, w16)), ulp);
  EXPECT_LE(scaled_error(ours.dw, dyd.reshape({-1, 24}).t().mm(x16.reshape({-1, 40}))), ulp);
  EXPECT_LE(scaled_error(ours.db, dyd.reshape({-1, 24}).sum(0)), ulp);
  // at::linear rounds the same products: the two agree within the same unit.
  EXPECT_LE(scaled_error(ours.y, aten.y), ulp);
  EXPECT_LE(scaled_error(ours.dw, aten.dw), ulp);
}

TEST(LinearOnednn, TheKernelsPluginServesFp32OnTheCpu) {
  if (!kernels::onednn_linear_chosen()) GTEST_SKIP() << "oneDNN's linear does not serve here (strata ops says why)";
  ComponentRegistry registry;
  PluginLoader(registry).load_search_path({STRATA_KERNELS_PLUGIN});
  OperatorTable::global().install(registry);
  const at::Tensor x = at::randn({3, 5});
  EXPECT_EQ(ops::select("linear", x).name(), "linear.onednn_cpu");
  EXPECT_EQ(ops::select("linear", x.to(at::kDouble)).name(), "linear.reference");
  EXPECT_EQ(ops::select("linear", x.to(at::kBFloat16)).name(),
            kernels::half_gemms_via_fp32(at::kBFloat16) ? "linear.onednn_cpu" : "linear.reference");
  OperatorTable::global().reset();
}

}  // namespace
}  // namespace strata
