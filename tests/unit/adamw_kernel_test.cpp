// The fused AdamW update (kernels/cpu/adamw.cpp) against core's adamw_update.reference
// (torch.optim.AdamW's arithmetic): several steps at sizes that are and are not multiples of the
// vector width, with and without weight decay, beta1 on both sides of ATen's lerp switch (0.5), a
// strided parameter, every compiled copy, and the table choosing the kernel for fp32 only.
#include <string>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "cpu/adamw.h"
#include "cpu/adamw_rows.h"
#include "cpu/attention_rows.h"
#include "strata/core/component_registry.h"
#include "strata/core/operator_table.h"
#include "strata/core/plugin_loader.h"
#include "strata/ops.h"

namespace strata {
namespace {

void reference(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m, const at::Tensor& v, const ops::AdamwHyper& h) {
  const auto& impls = OperatorTable::global().implementations("adamw_update");
  const auto& ref = static_cast<const ops::OperatorImpl<ops::AdamwUpdate>&>(*impls.back());
  ASSERT_EQ(ref.name(), "adamw_update.reference");
  ref.fn()(p, g, m, v, h);
}

double max_error(const at::Tensor& a, const at::Tensor& b) {
  return ((a.to(at::kDouble) - b.to(at::kDouble)).abs() / b.to(at::kDouble).abs().clamp_min(1e-3)).max().item<double>();
}

struct State {
  at::Tensor p, m, v;
};

// Three steps from the same start with fresh gradients; returns the worst relative difference of
// parameter and moments between `fn` and the reference.
template <class Fn>
double compare(Fn fn, int64_t n, double beta1, double weight_decay) {
  at::manual_seed(n);
  const at::Tensor p0 = at::randn({n});
  State ours{p0.clone(), at::zeros({n}), at::zeros({n})}, ref{p0.clone(), at::zeros({n}), at::zeros({n})};
  double worst = 0;
  for (int64_t step = 1; step <= 3; ++step) {
    const at::Tensor g = at::randn({n}) * (step == 2 ? 1e-3 : 1.0);  // a small gradient: eps matters
    const ops::AdamwHyper h{2e-3, beta1, 0.95, 1e-8, weight_decay, step};
    fn(ours.p, g, ours.m, ours.v, h);
    reference(ref.p, g, ref.m, ref.v, h);
    worst = std::max({worst, max_error(ours.p, ref.p), max_error(ours.m, ref.m), max_error(ours.v, ref.v)});
  }
  return worst;
}

TEST(AdamwKernel, MatchesTheReference) {
  // The copy this CPU runs (cpu_dispatch.cpp): the AVX2 one rounds as ATen's vectorised lerp;
  // the generic one (a CPU without AVX2, or STRATA_CPU_FALLBACK=avx2) rounds lerp's product
  // before the add: up to 2.0e-5 of a moment near the 1e-3 floor of the relative error (measured
  // at 70001 elements), still float rounding.
  const double tolerance = std::string(kernels::attention_row_ops_capability()) == "avx2" ? 2e-6 : 5e-5;
  for (int64_t n : {1, 7, 8, 9, 33, 1000, 70001})
    for (double beta1 : {0.9, 0.3})
      for (double wd : {0.0, 0.1})
        EXPECT_LE(compare(kernels::adamw_update_fused_cpu, n, beta1, wd), tolerance) << n << " beta1 " << beta1 << " wd " << wd;
}

TEST(AdamwKernel, EveryCompiledCopyMatchesTheReference) {
  auto with = [](kernels::AdamwRows rows) {
    return [rows](const at::Tensor& p, const at::Tensor& g, const at::Tensor& m, const at::Tensor& v, const ops::AdamwHyper& h) {
      rows(p.mutable_data_ptr<float>(), g.const_data_ptr<float>(), m.mutable_data_ptr<float>(), v.mutable_data_ptr<float>(),
           p.numel(), kernels::adamw_coefficients(h));
    };
  };
  // The generic copy rounds lerp's product before the add where ATen's (vectorised) lerp fuses
  // them: up to 3.6e-6 of a moment near zero (measured), still float rounding.
  EXPECT_LE(compare(with(&kernels::generic::adamw_rows), 1003, 0.9, 0.1), 1e-5);
#if defined(__x86_64__)
  EXPECT_LE(compare(with(&kernels::avx2::adamw_rows), 1003, 0.9, 0.1), 2e-6);
#endif
}

TEST(AdamwKernel, StridedTensorsAreWrittenBack) {
  at::manual_seed(1);
  const at::Tensor base = at::randn({12, 10});
  at::Tensor p = base.clone().t(), m = at::zeros({10, 12}), v = at::zeros({10, 12});  // p transposed
  at::Tensor p_ref = p.contiguous(), m_ref = m.clone(), v_ref = v.clone();
  const at::Tensor g = at::randn({10, 12});
  const ops::AdamwHyper h{1e-2, 0.9, 0.999, 1e-8, 0.1, 1};
  kernels::adamw_update_fused_cpu(p, g, m, v, h);
  reference(p_ref, g, m_ref, v_ref, h);
  EXPECT_LE(max_error(p, p_ref), 2e-6);
  EXPECT_LE(max_error(v, v_ref), 2e-6);
}

// The operator takes a parameter group: one call over tensors of several sizes is each tensor's
// own update, bit for bit (fused and reference alike).
TEST(AdamwKernel, AGroupIsEachOfItsTensors) {
  at::manual_seed(2);
  std::vector<at::Tensor> p, g, m, v;
  for (int64_t n : {1, 7, 33, 1000}) p.push_back(at::randn({n})), g.push_back(at::randn({n})), m.push_back(at::zeros({n})), v.push_back(at::zeros({n}));
  const ops::AdamwHyper h{1e-2, 0.9, 0.95, 1e-8, 0.1, 1};
  const auto& impls = OperatorTable::global().implementations("adamw_update");
  const auto& ref = static_cast<const ops::OperatorImpl<ops::AdamwUpdate>&>(*impls.back()).fn();
  for (const auto& fn : {std::function<ops::AdamwUpdate::Fn>(kernels::adamw_update_fused_cpu), ref}) {
    std::vector<at::Tensor> pg, mg, vg, p1, m1, v1;
    for (size_t i = 0; i < p.size(); ++i)
      pg.push_back(p[i].clone()), mg.push_back(m[i].clone()), vg.push_back(v[i].clone()), p1.push_back(p[i].clone()),
          m1.push_back(m[i].clone()), v1.push_back(v[i].clone());
    fn(pg, g, mg, vg, h);
    for (size_t i = 0; i < p.size(); ++i) fn(p1[i], g[i], m1[i], v1[i], h);
    for (size_t i = 0; i < p.size(); ++i)
      EXPECT_TRUE(at::equal(pg[i], p1[i]) && at::equal(mg[i], m1[i]) && at::equal(vg[i], v1[i])) << "tensor " << i;
  }
}

TEST(AdamwKernel, TheKernelsPluginServesFloatOnly) {
  ComponentRegistry registry;
  PluginLoader(registry).load_search_path({STRATA_KERNELS_PLUGIN});
  OperatorTable::global().install(registry);
  EXPECT_EQ(ops::select("adamw_update", at::zeros({2})).name(), "adamw_update.fused_cpu");
  EXPECT_EQ(ops::select("adamw_update", at::zeros({2}, at::kBFloat16)).name(), "adamw_update.reference");
  OperatorTable::global().reset();
}

}  // namespace
}  // namespace strata
