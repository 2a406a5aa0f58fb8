// attention.sdpa_cuda (kernels/cuda/attention_sdpa.cpp) on a GPU against core's attention.reference
// run on the CPU in fp64: output, log-sum-exp and dq/dk/dv with a loss that reaches the outputs
// through both out and lse, for every mask kind, grouped-query ratios 1/2/4, odd sequence lengths
// and head dims 32/64/80/128, fp32/bf16/fp16; and the operator table choosing it for CUDA tensors.
// Skips without a CUDA device, as on CI.
#include <cmath>
#include <limits>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "cuda/attention_sdpa.h"
#include "strata/core/component_registry.h"
#include "strata/core/operator_table.h"
#include "strata/core/plugin_loader.h"
#include "strata/ops.h"

namespace strata {
namespace {

ops::AttentionResult reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ops::AttentionMask& mask,
                               bool with_lse) {
  const auto& ref = static_cast<const ops::OperatorImpl<ops::Attention>&>(*OperatorTable::global().implementations("attention").back());
  EXPECT_EQ(ref.name(), "attention.reference");
  return ref.fn()(q, k, v, mask, with_lse);
}

// Relative to the largest reference entry. fp32: the kernels accumulate in fp32 in another order
// than the fp64 reference; bf16/fp16: inputs and outputs rounded to 8/11 bits of mantissa.
double tolerance(at::ScalarType dtype) { return dtype == at::kFloat ? 2e-5 : dtype == at::kHalf ? 5e-3 : 3e-2; }

void expect_close(const at::Tensor& ours, const at::Tensor& ref, double tol, const std::string& what) {
  ASSERT_EQ(ours.sizes(), ref.sizes()) << what;
  const at::Tensor a = ours.to(at::kCPU, at::kDouble), b = ref.to(at::kCPU, at::kDouble);
  const at::Tensor a_inf = a.isinf(), b_inf = b.isinf();
  EXPECT_TRUE(at::equal(a_inf, b_inf)) << what << ": infinities differ";
  EXPECT_FALSE(a.isnan().any().item<bool>()) << what << ": NaN";
  const at::Tensor fa = at::where(a_inf, at::zeros_like(a), a), fb = at::where(b_inf, at::zeros_like(b), b);
  const double scale = std::max(1.0, fb.abs().max().item<double>());
  const double err = (fa - fb).abs().max().item<double>();
  EXPECT_LE(err, tol * scale) << what << " differs by " << err << " (scale " << scale << ")";
}

ops::AttentionMask on(const ops::AttentionMask& mask, const at::Device& device, at::ScalarType dtype) {
  ops::AttentionMask m = mask;
  for (at::Tensor* t : {&m.q_index, &m.kv_index, &m.q_document, &m.kv_document})
    if (t->defined()) *t = t->to(device);
  if (mask.q_document.defined() && mask.q_document.is_same(mask.kv_document)) m.kv_document = m.q_document;  // as the models pass them
  if (m.additive) m.additive = m.additive->to(device, dtype);
  return m;
}

struct Shape {
  int64_t batch, heads, kv_heads, tq, tk, dim;
};

void check(at::ScalarType dtype, const Shape& s, const ops::AttentionMask& mask) {
  SCOPED_TRACE(std::string(c10::toString(dtype)) + " B" + std::to_string(s.batch) + " H" + std::to_string(s.heads) + "/" +
               std::to_string(s.kv_heads) + " Tq" + std::to_string(s.tq) + " Tk" + std::to_string(s.tk) + " D" + std::to_string(s.dim));
  const auto cpu = at::TensorOptions().dtype(at::kDouble);
  // Values representable in `dtype`, so both sides start from the same numbers.
  const at::Tensor q0 = at::randn({s.batch, s.heads, s.tq, s.dim}, cpu).to(dtype).to(at::kDouble);
  const at::Tensor k0 = at::randn({s.batch, s.kv_heads, s.tk, s.dim}, cpu).to(dtype).to(at::kDouble);
  const at::Tensor v0 = at::randn({s.batch, s.kv_heads, s.tk, s.dim}, cpu).to(dtype).to(at::kDouble);
  const at::Tensor w1 = at::randn({s.batch, s.heads, s.tq, s.dim}, cpu), w2 = at::randn({s.batch, s.heads, s.tq}, cpu);
  for (bool with_lse : {true, false}) {
    SCOPED_TRACE(with_lse ? "with lse" : "without lse");
    enum Which { kOperator, kEfficient, kReference };
    auto run = [&](Which which) {
      const bool gpu = which != kReference;
      const at::Device device = gpu ? at::Device(at::kCUDA) : at::Device(at::kCPU);
      const auto type = gpu ? dtype : at::kDouble;
      std::vector<at::Tensor> inputs{q0.to(device, type).requires_grad_(true), k0.to(device, type).requires_grad_(true),
                                     v0.to(device, type).requires_grad_(true)};
      const ops::AttentionMask m = on(mask, device, type);
      const ops::AttentionResult r = which == kOperator    ? kernels::attention_sdpa_cuda(inputs[0], inputs[1], inputs[2], m, with_lse)
                                     : which == kEfficient ? kernels::attention_efficient_cuda(inputs[0], inputs[1], inputs[2], m, with_lse)
                                                           : reference(inputs[0], inputs[1], inputs[2], m, with_lse);
      at::Tensor loss = (r.out.to(at::kDouble) * w1.to(device)).sum();
      if (with_lse) {
        EXPECT_TRUE(r.lse.defined());
        const at::Tensor finite = at::where(r.lse.isinf(), at::zeros_like(r.lse), r.lse);
        loss = loss + (finite.to(at::kDouble) * w2.to(device)).sum();
      } else {
        EXPECT_FALSE(r.lse.defined());
      }
      return std::make_pair(r, torch::autograd::grad({loss}, inputs));
    };
    const auto [ref, ref_grads] = run(kReference);
    const double tol = tolerance(dtype);
    for (Which which : {kOperator, kEfficient}) {  // the operator's choice, and the memory-efficient path always
      SCOPED_TRACE(which == kOperator ? "attention_sdpa_cuda" : "attention_efficient_cuda");
      const auto [ours, our_grads] = run(which);
      expect_close(ours.out, ref.out, tol, "out");
      if (with_lse) expect_close(ours.lse, ref.lse, tol, "lse");
      const char* names[] = {"dq", "dk", "dv"};
      for (size_t i = 0; i < 3; ++i) expect_close(our_grads[i], ref_grads[i], 2 * tol, names[i]);
    }
  }
}

at::Tensor documents(int64_t batch, int64_t t, int64_t seed) {  // runs of 1..t/3 tokens, different per row
  at::Tensor docs = at::empty({batch, t}, at::kLong);
  auto acc = docs.accessor<int64_t, 2>();
  for (int64_t b = 0; b < batch; ++b) {
    int64_t id = 0, left = 1 + (seed + 5 * b) % std::max<int64_t>(1, t / 3);
    for (int64_t i = 0; i < t; ++i) {
      acc[b][i] = id;
      if (--left == 0) ++id, left = 1 + (seed * 7 + i + b) % std::max<int64_t>(1, t / 3);
    }
  }
  return docs;
}

class AttentionCuda : public ::testing::TestWithParam<at::ScalarType> {
 protected:
  void SetUp() override {
    if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
    OperatorTable::global().reset();
    at::manual_seed(0);
  }
};

TEST_P(AttentionCuda, EveryMaskKind) {
  const at::ScalarType dtype = GetParam();
  ops::AttentionMask none, causal, window, docs, docs_causal, additive, permuted, prefix;
  causal.causal = window.causal = docs_causal.causal = permuted.causal = prefix.causal = true;
  window.sliding_window = 9;
  docs.q_document = docs.kv_document = documents(2, 45, 3);
  docs_causal.q_document = docs_causal.kv_document = documents(2, 45, 5);
  additive.additive = at::randn({2, 1, 45, 45}, at::kDouble).to(dtype);
  // Context parallel's zig-zag: queries are chunks 0 and 5 of 6 (the first sees no key of chunks 1 and 4).
  const int64_t chunk = 7;
  permuted.q_index = at::cat({at::arange(0, chunk, at::kLong), at::arange(5 * chunk, 6 * chunk, at::kLong)});
  permuted.kv_index = at::cat({at::arange(chunk, 2 * chunk, at::kLong), at::arange(4 * chunk, 5 * chunk, at::kLong)});
  const Shape square{2, 4, 4, 45, 45, 64};
  for (const auto* mask : {&none, &causal, &window, &docs, &docs_causal, &additive}) check(dtype, square, *mask);
  check(dtype, {2, 4, 4, 2 * chunk, 2 * chunk, 64}, permuted);
  check(dtype, {2, 4, 4, 13, 41, 64}, prefix);  // Tq < Tk: the queries are the last Tq tokens
}

TEST_P(AttentionCuda, GroupedQueryOddLengthsAndHeadDims) {
  const at::ScalarType dtype = GetParam();
  for (int64_t group : {1, 2, 4})
    for (int64_t t : {1, 7, 33, 127, 1000})
      for (bool is_causal : {false, true}) {
        ops::AttentionMask mask;
        mask.causal = is_causal;
        check(dtype, {1, 4, 4 / group, t, t, 64}, mask);
        if (t == 127) {
          mask.q_document = mask.kv_document = documents(1, t, 2);
          check(dtype, {1, 4, 4 / group, t, t, 64}, mask);
        }
      }
  for (int64_t dim : {32, 80, 128}) {
    ops::AttentionMask mask;
    mask.causal = true;
    check(dtype, {2, 2, 1, 33, 33, dim}, mask);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, AttentionCuda, ::testing::Values(at::kFloat, at::kBFloat16, at::kHalf),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

// With the kernels plugin installed, CUDA tensors get attention.sdpa_cuda; fp64 the reference.
TEST(AttentionCudaTable, ChosenForCudaTensors) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  ComponentRegistry registry;
  PluginLoader(registry).load_search_path({installed_plugin_dir()});
  OperatorTable::global().reset();
  OperatorTable::global().install(registry);
  const at::Tensor probe = at::zeros({1}, at::TensorOptions().device(at::kCUDA));
  EXPECT_EQ(OperatorTable::global().select("attention", probe).name(), "attention.sdpa_cuda");
  EXPECT_EQ(OperatorTable::global().select("attention", probe.to(at::kDouble)).name(), "attention.reference");
  EXPECT_EQ(OperatorTable::global().select("attention", probe.cpu()).name(), "attention.fused_cpu");
  OperatorTable::global().reset();
}

}  // namespace
}  // namespace strata
