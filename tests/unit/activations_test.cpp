// The fused activations (kernels/cpu/activations.cpp) against core's references (gelu.reference:
// ATen's gelu "tanh"; swiglu.reference: silu(gate) * up) and against the formulas in fp64: values
// and gradients at sizes that are and are not multiples of the vector width (1, 7, 8, 15, 16, 17,
// 33, 1000, 70001: the last spans several threads' ranges), inputs out to +-30 where exp
// saturates, non-contiguous inputs, fp32 and bf16/half, and the table choosing the kernels.
#include <algorithm>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "cpu/activation_math.h"
#include "cpu/activations.h"
#include "strata/core/component_registry.h"
#include "strata/core/operator_table.h"
#include "strata/core/plugin_loader.h"
#include "strata/ops.h"
#include "../elementwise_error.h"

namespace strata {
namespace {

const int64_t kSizes[] = {1, 7, 8, 15, 16, 17, 33, 1000, 70001};

using testing::max_elementwise_error;

// Inputs spread over where GELU and SiLU bend, with the saturated ends included.
at::Tensor inputs(int64_t n, at::ScalarType dtype, int64_t seed) {
  at::manual_seed(seed);
  at::Tensor x = at::randn({n}, at::kDouble) * 3;
  if (n >= 4) {
    x[0] = 30.0;
    x[1] = -30.0;
    x[2] = 0.0;
    x[3] = -9.0;
  }
  return x.to(dtype);
}

at::Tensor gelu_formula(const at::Tensor& x) {  // fp64, from the definition
  return 0.5 * x * (1 + at::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

struct Result {
  at::Tensor y, dx, du;
};

template <class Fn>
Result gelu_run(Fn fn, const at::Tensor& x0, const at::Tensor& dy) {
  at::Tensor x = x0.clone().requires_grad_(true);
  at::Tensor y = fn(x);
  return {y.detach(), torch::autograd::grad({y}, {x}, {dy})[0], at::Tensor()};
}

template <class Fn>
Result swiglu_run(Fn fn, const at::Tensor& g0, const at::Tensor& u0, const at::Tensor& dy) {
  at::Tensor g = g0.clone().requires_grad_(true), u = u0.clone().requires_grad_(true);
  at::Tensor y = fn(g, u);
  const auto grads = torch::autograd::grad({y}, {g, u}, {dy});
  return {y.detach(), grads[0], grads[1]};
}

TEST(Activations, GeluMatchesTheFormulaInFloat) {
  for (int64_t n : kSizes) {
    const at::Tensor x = inputs(n, at::kFloat, n), dy = at::randn({n});
    const Result ours = gelu_run(kernels::gelu_tanh_fused_cpu, x, dy);
    const Result exact = gelu_run(gelu_formula, x.to(at::kDouble), dy.to(at::kDouble));
    const Result reference = gelu_run([](const at::Tensor& t) { return at::gelu(t, "tanh"); }, x, dy);
    // fp32 rounding: a few ulp of the larger of 1 and the value; the reference is no closer.
    EXPECT_LE(max_elementwise_error(ours.y, exact.y), 1e-6) << n;
    EXPECT_LE(max_elementwise_error(ours.dx, exact.dx), 2e-6) << n;
    EXPECT_LE(max_elementwise_error(ours.y, reference.y), 2e-6) << n;
    EXPECT_LE(max_elementwise_error(ours.dx, reference.dx), 4e-6) << n;
    EXPECT_EQ(ours.y.scalar_type(), at::kFloat);
    EXPECT_FALSE(ours.y.isnan().any().item<bool>() || ours.dx.isnan().any().item<bool>()) << n;
  }
}

TEST(Activations, SwigluMatchesTheFormulaInFloat) {
  for (int64_t n : kSizes) {
    const at::Tensor g = inputs(n, at::kFloat, n), u = inputs(n, at::kFloat, n + 1) / 3, dy = at::randn({n});
    const Result ours = swiglu_run(kernels::swiglu_fused_cpu, g, u, dy);
    const Result exact = swiglu_run([](const at::Tensor& a, const at::Tensor& b) { return a * at::sigmoid(a) * b; },
                                    g.to(at::kDouble), u.to(at::kDouble), dy.to(at::kDouble));
    EXPECT_LE(max_elementwise_error(ours.y, exact.y), 2e-6) << n;
    EXPECT_LE(max_elementwise_error(ours.dx, exact.dx), 4e-6) << n;
    EXPECT_LE(max_elementwise_error(ours.du, exact.du), 2e-6) << n;
    EXPECT_FALSE(ours.dx.isnan().any().item<bool>() || ours.du.isnan().any().item<bool>()) << n;
  }
}

// 16-bit storage: both compute in float and round once, so they agree to a unit in the last place
// of the 16-bit type (2^-8 for bf16, 2^-11 for half), relative to max(1, |value|).
TEST(Activations, SixteenBitTypesMatchTheReference) {
  for (auto [dtype, tol] : {std::pair{at::kBFloat16, 8e-3}, std::pair{at::kHalf, 1e-3}}) {
    for (int64_t n : {7L, 33L, 1000L}) {
      const at::Tensor x = inputs(n, at::kFloat, n).clamp(-9, 9).to(dtype), dy = at::randn({n}).to(dtype);
      const Result ours = gelu_run(kernels::gelu_tanh_fused_cpu, x, dy);
      const Result reference = gelu_run([](const at::Tensor& t) { return at::gelu(t, "tanh"); }, x, dy);
      EXPECT_EQ(ours.y.scalar_type(), dtype);
      EXPECT_EQ(ours.dx.scalar_type(), dtype);
      EXPECT_LE(max_elementwise_error(ours.y, reference.y), tol) << dtype << " " << n;
      EXPECT_LE(max_elementwise_error(ours.dx, reference.dx), 2 * tol) << dtype << " " << n;
      const at::Tensor u = (at::randn({n}) / 2).to(dtype);
      const Result s_ours = swiglu_run(kernels::swiglu_fused_cpu, x, u, dy);
      const Result s_ref = swiglu_run([](const at::Tensor& a, const at::Tensor& b) { return at::silu(a) * b; }, x, u, dy);
      EXPECT_LE(max_elementwise_error(s_ours.y, s_ref.y), 2 * tol) << dtype << " " << n;
      EXPECT_LE(max_elementwise_error(s_ours.dx, s_ref.dx), 4 * tol) << dtype << " " << n;
      EXPECT_LE(max_elementwise_error(s_ours.du, s_ref.du), 2 * tol) << dtype << " " << n;
    }
  }
}

TEST(Activations, NonContiguousInputsAndGradients) {
  const at::Tensor wide = inputs(2 * 4 * 37, at::kFloat, 5).view({4, 74});
  const at::Tensor gate = wide.narrow(1, 0, 37), up = wide.narrow(1, 37, 37);  // Llama's chunked projection
  const at::Tensor dy = at::randn({37, 4}).t();                               // a transposed gradient
  const Result ours = swiglu_run(kernels::swiglu_fused_cpu, gate, up, dy);
  const Result reference = swiglu_run([](const at::Tensor& a, const at::Tensor& b) { return at::silu(a) * b; }, gate, up, dy);
  EXPECT_LE(max_elementwise_error(ours.y, reference.y), 4e-6);
  EXPECT_LE(max_elementwise_error(ours.dx, reference.dx), 8e-6);
  EXPECT_LE(max_elementwise_error(ours.du, reference.du), 4e-6);
  const Result g_ours = gelu_run(kernels::gelu_tanh_fused_cpu, gate, dy);
  const Result g_ref = gelu_run([](const at::Tensor& t) { return at::gelu(t, "tanh"); }, gate, dy);
  EXPECT_LE(max_elementwise_error(g_ours.y, g_ref.y), 2e-6);
  EXPECT_LE(max_elementwise_error(g_ours.dx, g_ref.dx), 4e-6);
}

// The copy this CPU runs (AVX2 here) and the generic one give the same values to a few ulp (FMA
// contracts some products; exp_u20 is the same polynomial).
TEST(Activations, EveryCompiledCopyAgrees) {
#if defined(__x86_64__)
  const int64_t n = 1003;
  const at::Tensor x = inputs(n, at::kFloat, 3), u = inputs(n, at::kFloat, 4) / 3, dy = at::randn({n});
  std::vector<at::Tensor> outs;
  for (const kernels::ActivationOps<float>* ops : {&kernels::generic::activation_ops_float(), &kernels::avx2::activation_ops_float()}) {
    at::Tensor y = at::empty({n}), dx = at::empty({n}), s = at::empty({n}), dg = at::empty({n}), du = at::empty({n});
    ops->gelu_tanh_forward(x.const_data_ptr<float>(), y.mutable_data_ptr<float>(), n);
    ops->gelu_tanh_backward(x.const_data_ptr<float>(), dy.const_data_ptr<float>(), dx.mutable_data_ptr<float>(), n);
    ops->swiglu_forward(x.const_data_ptr<float>(), u.const_data_ptr<float>(), s.mutable_data_ptr<float>(), n);
    ops->swiglu_backward(x.const_data_ptr<float>(), u.const_data_ptr<float>(), dy.const_data_ptr<float>(), dg.mutable_data_ptr<float>(),
                         du.mutable_data_ptr<float>(), n);
    outs.push_back(at::cat({y, dx, s, dg, du}));
  }
  EXPECT_LE(max_elementwise_error(outs[0], outs[1]), 1e-6);
#else
  GTEST_SKIP() << "one compiled copy on this architecture";
#endif
}

TEST(Activations, TheKernelsPluginServesTheOperators) {
  ComponentRegistry registry;
  PluginLoader(registry).load_search_path({STRATA_KERNELS_PLUGIN});
  OperatorTable::global().install(registry);
  const at::Tensor x = at::randn({3, 5});
  EXPECT_EQ(ops::select("gelu", x).name(), "gelu.fused_cpu");
  EXPECT_EQ(ops::select("swiglu", x).name(), "swiglu.fused_cpu");
  EXPECT_EQ(ops::select("gelu", x.to(at::kBFloat16)).name(), "gelu.fused_cpu");
  EXPECT_EQ(ops::select("gelu", x.to(at::kDouble)).name(), "gelu.reference");  // no fp64 copy: the reference serves it
  EXPECT_LE(max_elementwise_error(ops::gelu(x), at::gelu(x, "tanh")), 2e-6);
#ifdef STRATA_HAVE_CUDA_KERNELS
  // Built with nvcc: the CUDA kernels are registered too (they run in tests/gpu on a GPU).
  for (const char* op : {"gelu", "swiglu", "rms_norm"}) {
    std::vector<std::string> names;
    for (const auto* impl : OperatorTable::global().implementations(op)) names.push_back(impl->name());
    EXPECT_NE(std::find(names.begin(), names.end(), std::string(op) + ".fused_cuda"), names.end()) << op;
  }
#endif
  OperatorTable::global().reset();
}

}  // namespace
}  // namespace strata
