// Every reference operator against a plain ATen composition written from the formula: values
// and gradients, in double precision.
#include <cmath>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "strata/errors.h"
#include "strata/nn.h"
#include "strata/ops.h"

namespace strata {
namespace {

at::TensorOptions f64() { return at::TensorOptions().dtype(at::kDouble); }

at::Tensor leaf(std::vector<int64_t> shape) { return at::randn(shape, f64()).requires_grad_(true); }

// Checks values and the gradients of `inputs` for both computations under the same upstream grad.
void expect_same(const std::function<at::Tensor()>& ours, const std::function<at::Tensor()>& plain,
                 const std::vector<at::Tensor>& inputs) {
  at::Tensor a = ours(), b = plain();
  ASSERT_EQ(a.sizes(), b.sizes());
  EXPECT_TRUE(at::allclose(a, b, 1e-10, 1e-10)) << (a - b).abs().max().item<double>();
  at::Tensor upstream = at::randn(a.sizes(), f64());
  auto ga = torch::autograd::grad({a}, inputs, {upstream}, true, false, true);
  auto gb = torch::autograd::grad({b}, inputs, {upstream}, true, false, true);
  for (size_t i = 0; i < inputs.size(); ++i) {
    ASSERT_TRUE(ga[i].defined() && gb[i].defined()) << "input " << i;
    EXPECT_TRUE(at::allclose(ga[i], gb[i], 1e-9, 1e-9)) << "gradient of input " << i << " differs by "
                                                         << (ga[i] - gb[i]).abs().max().item<double>();
  }
}

at::Tensor plain_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal, const at::Tensor& mask) {
  const int64_t repeat = q.size(1) / k.size(1);
  at::Tensor kk = k.repeat_interleave(repeat, 1), vv = v.repeat_interleave(repeat, 1);
  at::Tensor scores = q.matmul(kk.transpose(-1, -2)) / std::sqrt(static_cast<double>(q.size(-1)));
  if (mask.defined()) scores = scores + mask;
  if (causal) {
    at::Tensor upper = at::ones({q.size(2), k.size(2)}, at::kBool).triu(1);
    scores = scores.masked_fill(upper, -std::numeric_limits<double>::infinity());
  }
  return scores.softmax(-1).matmul(vv);
}

class Ops : public ::testing::Test {
 protected:
  void SetUp() override { at::manual_seed(0); }
};

TEST_F(Ops, AttentionCausal) {
  at::Tensor q = leaf({2, 4, 5, 8}), k = leaf({2, 4, 5, 8}), v = leaf({2, 4, 5, 8});
  expect_same([&] { return ops::attention(q, k, v, true); }, [&] { return plain_attention(q, k, v, true, {}); }, {q, k, v});
}

TEST_F(Ops, AttentionGroupedQueryWithMask) {
  at::Tensor q = leaf({2, 4, 6, 8}), k = leaf({2, 2, 6, 8}), v = leaf({2, 2, 6, 8});
  at::Tensor mask = at::randn({6, 6}, f64());
  expect_same([&] { return ops::attention(q, k, v, false, mask); }, [&] { return plain_attention(q, k, v, false, mask); },
              {q, k, v});
  expect_same([&] { return ops::attention(q, k, v, true, mask); }, [&] { return plain_attention(q, k, v, true, mask); },
              {q, k, v});
}

TEST_F(Ops, LayerNorm) {
  at::Tensor x = leaf({3, 5, 16}), w = leaf({16}), b = leaf({16});
  auto plain = [&] {
    at::Tensor mean = x.mean(-1, true), var = (x - mean).pow(2).mean(-1, true);
    return (x - mean) / (var + 1e-5).sqrt() * w + b;
  };
  expect_same([&] { return ops::layer_norm(x, w, b, 1e-5); }, plain, {x, w, b});
}

TEST_F(Ops, RmsNorm) {
  at::Tensor x = leaf({3, 5, 16}), w = leaf({16});
  expect_same([&] { return ops::rms_norm(x, w, 1e-6); }, [&] { return w * x / (x.pow(2).mean(-1, true) + 1e-6).sqrt(); },
              {x, w});
}

TEST_F(Ops, Linear) {
  at::Tensor x = leaf({3, 7}), w = leaf({4, 7}), b = leaf({4});
  expect_same([&] { return ops::linear(x, w, b); }, [&] { return x.matmul(w.t()) + b; }, {x, w, b});
  expect_same([&] { return ops::linear(x, w, std::nullopt); }, [&] { return x.matmul(w.t()); }, {x, w});
}

TEST_F(Ops, GeluTanh) {
  at::Tensor x = leaf({4, 9});
  const double c = std::sqrt(2.0 / M_PI);
  expect_same([&] { return ops::gelu(x); }, [&] { return 0.5 * x * (1 + at::tanh(c * (x + 0.044715 * x.pow(3)))); }, {x});
}

TEST_F(Ops, SwiGlu) {
  at::Tensor g = leaf({4, 9}), u = leaf({4, 9});
  expect_same([&] { return ops::swiglu(g, u); }, [&] { return g * at::sigmoid(g) * u; }, {g, u});
}

TEST_F(Ops, RopeRotateHalf) {
  at::Tensor x = leaf({2, 3, 5, 8});
  at::Tensor angles = at::outer(at::arange(5, f64()), at::rand({4}, f64()));
  at::Tensor cos = angles.cos(), sin = angles.sin();
  auto plain = [&] {
    at::Tensor cos_full = at::cat({cos, cos}, -1), sin_full = at::cat({sin, sin}, -1);
    at::Tensor rotated = at::cat({-x.narrow(-1, 4, 4), x.narrow(-1, 0, 4)}, -1);
    return x * cos_full + rotated * sin_full;
  };
  expect_same([&] { return ops::rope(x, cos, sin); }, plain, {x});
}

TEST_F(Ops, CrossEntropy) {
  at::Tensor logits = leaf({6, 11});
  at::Tensor targets = at::randint(11, {6}, at::kLong);
  // The operator computes in fp32, so compare in fp32 with a matching tolerance.
  at::Tensor ours = ops::cross_entropy(logits, targets);
  at::Tensor plain = -logits.log_softmax(-1).gather(1, targets.unsqueeze(1)).mean();
  EXPECT_EQ(ours.scalar_type(), at::kFloat);
  EXPECT_NEAR(ours.item<double>(), plain.item<double>(), 1e-6);
  auto ga = torch::autograd::grad({ours}, {logits});
  auto gb = torch::autograd::grad({plain}, {logits});
  EXPECT_TRUE(at::allclose(ga[0], gb[0], 1e-6, 1e-6));
}

}  // namespace
}  // namespace strata

#include "strata/core/operator_table.h"

namespace strata {
namespace {

at::Tensor doubled_gelu(const at::Tensor& x) { return x * 2; }

void register_bf16_gelu(Registry& registry) {
  registry.add(std::make_unique<ops::OperatorImpl<ops::Gelu>>(
      "gelu.test_bf16", "test implementation", &doubled_gelu, ops::Support{{c10::DeviceType::CPU}, {at::kBFloat16}}, 10));
}

struct Bogus {
  static constexpr const char* name = "no_such_op";
  using Fn = at::Tensor(const at::Tensor&);
};

void register_unknown_op(Registry& registry) {
  registry.add(std::make_unique<ops::OperatorImpl<Bogus>>("bogus.impl", "", &doubled_gelu));
}

TEST(OperatorTable, PluginImplementationServesWhatItSupportsAndFallsBackOtherwise) {
  ComponentRegistry registry;
  registry.register_plugin(PluginRecord{"ops_test", "0", "<test>", "", {}}, &register_bf16_gelu);
  OperatorTable& table = OperatorTable::global();
  table.install(registry);
  at::Tensor x = at::ones({3});
  EXPECT_EQ(table.select("gelu", x.to(at::kBFloat16)).name(), "gelu.test_bf16");
  EXPECT_EQ(table.select("gelu", x).name(), "gelu.reference");
  EXPECT_TRUE(at::equal(ops::gelu(x.to(at::kBFloat16)), (x * 2).to(at::kBFloat16)));
  EXPECT_TRUE(at::allclose(ops::gelu(x), at::gelu(x, "tanh")));
  table.reset();
  EXPECT_EQ(table.select("gelu", x.to(at::kBFloat16)).name(), "gelu.reference");
}

TEST(OperatorTable, ImplementationOfAnUnknownOperatorIsRefused) {
  ComponentRegistry registry;
  registry.register_plugin(PluginRecord{"bogus", "0", "<test>", "", {}}, &register_unknown_op);
  try {
    OperatorTable::global().install(registry);
    FAIL() << "accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("'bogus.impl' from plugin 'bogus' is for unknown operator 'no_such_op'"), std::string::npos);
  }
  OperatorTable::global().reset();
}

// A plugin-defined operator: its reference, more implementations, pins per block.
struct Triple {
  static constexpr const char* name = "triple";
  using Fn = at::Tensor(const at::Tensor&);
};
struct TripleOtherType {  // same name, another function type
  static constexpr const char* name = "triple";
  using Fn = at::Tensor(const at::Tensor&, double);
};
at::Tensor triple(const at::Tensor& x) { return x * 3; }
at::Tensor triple_scaled(const at::Tensor& x, double) { return x * 3; }

void register_triple(Registry& registry) {
  registry.add(ops::define_operator<Triple>("x * 3", &triple));
  registry.add(std::make_unique<ops::OperatorImpl<Triple>>("triple.fast", "x * 3", &triple, ops::Support{}, 10));
  registry.add(std::make_unique<ops::OperatorImpl<Triple>>("triple.bf16_only", "x * 3", &triple,
                                                           ops::Support{{}, {at::kBFloat16}}, 1));
}
void register_opt_in_triple(Registry& registry) {  // priority 0 or less: served only where pinned
  registry.add(ops::define_operator<Triple>("x * 3", &triple));
  registry.add(std::make_unique<ops::OperatorImpl<Triple>>("triple.opt_in", "x * 3", &triple, ops::Support{}, 0));
  registry.add(std::make_unique<ops::OperatorImpl<Triple>>("triple.opt_in_below", "x * 3", &triple, ops::Support{}, -1));
}
void register_triple_again(Registry& registry) {  // a second definer under another component name
  registry.add(std::make_unique<ops::OperatorImpl<Triple>>("triple.again", "again", &triple, ops::Support{}, 0, /*defines=*/true));
}
void register_triple_other_type(Registry& registry) {
  registry.add(std::make_unique<ops::OperatorImpl<TripleOtherType>>("triple.odd", "", &triple_scaled));
}

TEST(OperatorTable, PluginDefinesAnOperatorAndPinsSelectPerBlock) {
  ComponentRegistry registry;
  registry.register_plugin(PluginRecord{"triple", "0", "<test>", "", {}}, &register_triple);
  OperatorTable& table = OperatorTable::global();
  table.install(registry);
  const at::Tensor x = at::ones({2});
  EXPECT_EQ(table.defined_by("triple"), "plugin 'triple'");
  EXPECT_EQ(table.select("triple", x).name(), "triple.fast");
  EXPECT_TRUE(at::equal(ops::call<Triple>(x, x), x * 3));

  ops::pin("triple", "triple.reference", {"block"});
  const std::string block = "block", head = "head", h0 = "h.0";
  {
    const ops::BlockScope scope(h0, block);  // pinned by type
    EXPECT_EQ(ops::select("triple", x).name(), "triple.reference");
  }
  {
    const ops::BlockScope scope(head, head);  // not pinned
    EXPECT_EQ(ops::select("triple", x).name(), "triple.fast");
  }
  ops::pin("triple", "triple.bf16_only", {"h.0"});  // newer pin, by name
  {
    const ops::BlockScope scope(h0, block);
    EXPECT_EQ(ops::select("triple", x.to(at::kBFloat16)).name(), "triple.bf16_only");
    EXPECT_THROW(ops::select("triple", x), UserError);  // pinned, unsupported: never a silent fallback
  }
  EXPECT_THROW(ops::pin("triple", "triple.nope"), UserError);
  EXPECT_THROW(ops::pin("quadruple", "x"), UserError);
  table.reset();
  EXPECT_THROW(table.defined_by("triple"), std::out_of_range);
}

TEST(OperatorTable, OptInImplementationServesOnlyWherePinnedAndTheReferenceStaysLast) {
  ComponentRegistry registry;
  registry.register_plugin(PluginRecord{"triple", "0", "<test>", "", {}}, &register_opt_in_triple);
  OperatorTable& table = OperatorTable::global();
  table.install(registry);
  const at::Tensor x = at::ones({2});
  const auto impls = ops::implementations("triple");
  ASSERT_EQ(impls.size(), 3u);
  EXPECT_EQ(impls[0]->name(), "triple.opt_in");
  EXPECT_EQ(impls[1]->name(), "triple.opt_in_below");
  EXPECT_EQ(impls.back()->name(), "triple.reference");  // callers find the reference at the back
  EXPECT_EQ(table.select("triple", x).name(), "triple.reference");
  ops::pin("triple", "triple.opt_in_below");
  EXPECT_EQ(table.select("triple", x).name(), "triple.opt_in_below");
  ops::pin("triple", "triple.opt_in");
  EXPECT_EQ(table.select("triple", x).name(), "triple.opt_in");
  table.reset();
}

TEST(OperatorTable, OperatorDefinedTwiceOrWithAnotherTypeIsRefused) {
  ComponentRegistry twice;
  twice.register_plugin(PluginRecord{"triple", "0", "<test>", "", {}}, &register_triple);
  twice.register_plugin(PluginRecord{"again", "0", "<test>", "", {}}, &register_triple_again);
  try {
    OperatorTable::global().install(twice);
    FAIL() << "accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("operator 'triple' is defined by plugin 'triple' and by plugin 'again'"), std::string::npos) << e.what();
  }
  ComponentRegistry odd;
  odd.register_plugin(PluginRecord{"triple", "0", "<test>", "", {}}, &register_triple);
  odd.register_plugin(PluginRecord{"odd", "0", "<test>", "", {}}, &register_triple_other_type);
  try {
    OperatorTable::global().install(odd);
    FAIL() << "accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("'triple.odd' from plugin 'odd' has another function type"), std::string::npos) << e.what();
  }
  OperatorTable::global().reset();
}

// `strata run -n N` plans again with a fresh registry before each elastic restart; the table
// must then hold that registry's implementations only, never the destroyed one's (CI once read
// a freed implementation's function type there).
TEST(OperatorTable, InstallReplacesWhatAnEarlierRegistryInstalled) {
  for (int round = 0; round < 3; ++round) {
    ComponentRegistry registry;
    registry.register_plugin(PluginRecord{"ops_test", "0", "<test>", "", {}}, &register_bf16_gelu);
    registry.register_plugin(PluginRecord{"triple", "0", "<test>", "", {}}, &register_triple);
    OperatorTable::global().install(registry);
    OperatorTable::global().install(registry);  // the same registry again (plan, then the trainer)
    ASSERT_EQ(ops::implementations("gelu").size(), 2u) << "round " << round;
    ASSERT_EQ(ops::implementations("triple").size(), 3u) << "round " << round;
    EXPECT_EQ(ops::implementations("gelu").front()->name(), "gelu.test_bf16");
  }
  OperatorTable::global().reset();
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// -inf where a query must not see a key: later window positions, other documents.
at::Tensor blocked_pairs(const at::Tensor& q_index, const at::Tensor& kv_index, const at::Tensor& q_doc, const at::Tensor& kv_doc) {
  at::Tensor blocked = kv_index.unsqueeze(0).gt(q_index.unsqueeze(1)).unsqueeze(0);  // [1, Tq, Tk]
  if (q_doc.defined()) blocked = blocked.logical_or(q_doc.unsqueeze(2).ne(kv_doc.unsqueeze(1)));  // [B, Tq, Tk]
  return at::zeros(blocked.sizes(), f64()).masked_fill(blocked, -std::numeric_limits<double>::infinity()).unsqueeze(1);
}

class Attention : public ::testing::Test {
 protected:
  void SetUp() override { at::manual_seed(0); }
};

// Packed documents: a token attends to earlier tokens of its own document only, and the mask
// follows window positions, so any permutation of the tokens (context parallel's order) gives
// the same outputs, permuted.
TEST_F(Attention, FollowsDocumentsAndWindowPositions) {
  at::Tensor q = leaf({2, 2, 10, 4}), k = leaf({2, 1, 10, 4}), v = leaf({2, 1, 10, 4});
  const at::Tensor docs = at::tensor({0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1}, at::kLong).view({2, 10});
  const at::Tensor index = at::arange(10, at::kLong);
  ops::AttentionMask mask;
  mask.causal = true;
  mask.q_document = mask.kv_document = docs;
  expect_same([&] { return ops::attention(q, k, v, mask).out; },
              [&] { return plain_attention(q, k, v, false, blocked_pairs(index, index, docs, docs)); }, {q, k, v});
  const at::Tensor perm = at::randperm(10, at::kLong);
  ops::AttentionMask permuted = mask;
  permuted.q_index = permuted.kv_index = perm;
  permuted.q_document = permuted.kv_document = docs.index_select(1, perm);
  auto p = [&](const at::Tensor& x) { return x.index_select(2, perm); };
  const at::Tensor whole = ops::attention(q, k, v, mask).out;
  EXPECT_TRUE(at::allclose(ops::attention(p(q), p(k), p(v), permuted).out, p(whole), 1e-12, 1e-12));
}

// The log-sum-exp is that of the visible scores, and two partial results over disjoint keys merge
// into the whole attention (ring attention's rule), values and gradients; a query that sees no
// key of a block gets zeros and -inf without NaN gradients.
TEST_F(Attention, LogSumExpMergesPartialResults) {
  at::Tensor q = leaf({1, 2, 6, 4}), k = leaf({1, 2, 8, 4}), v = leaf({1, 2, 8, 4});
  const at::Tensor q_index = at::arange(2, 8, at::kLong), kv_index = at::arange(8, at::kLong);
  auto block = [&](int64_t start, int64_t length) {
    ops::AttentionMask mask;
    mask.causal = true;
    mask.q_index = q_index;
    mask.kv_index = kv_index.narrow(0, start, length);
    return ops::attention(q, k.narrow(2, start, length), v.narrow(2, start, length), mask, /*with_lse=*/true);
  };
  const ops::AttentionResult whole = block(0, 8);
  const at::Tensor scores = q.matmul(k.transpose(-1, -2)) / 2.0 + blocked_pairs(q_index, kv_index, {}, {});
  EXPECT_TRUE(at::allclose(whole.lse, scores.logsumexp(-1), 1e-12, 1e-12));
  auto merged = [&] {
    const ops::AttentionResult a = block(0, 3), b = block(3, 5);
    const at::Tensor lse = at::logaddexp(a.lse, b.lse);
    return a.out * at::exp(a.lse - lse).unsqueeze(-1) + b.out * at::exp(b.lse - lse).unsqueeze(-1);
  };
  expect_same(merged, [&] { return whole.out; }, {q, k, v});
  ops::AttentionMask future;
  future.causal = true;
  future.q_index = at::arange(0, 6, at::kLong);
  future.kv_index = at::arange(3, 11, at::kLong);
  const ops::AttentionResult r = ops::attention(q, k, v, future, true);
  EXPECT_TRUE(r.out.narrow(2, 0, 3).eq(0).all().item<bool>());
  EXPECT_TRUE(at::isinf(r.lse.narrow(2, 0, 3)).all().item<bool>());
  const auto grads = torch::autograd::grad({r.out.sum() + r.lse.narrow(2, 3, 3).sum()}, {q, k, v});
  for (const auto& g : grads) EXPECT_TRUE(g.isfinite().all().item<bool>());
}

TEST(PackedSequence, DocumentsAndPositionsRestartAfterEachEndToken) {
  const at::Tensor tokens = at::tensor({5, 9, 0, 7, 0, 0, 3, 4, 1, 2, 3, 4}, at::kLong).view({2, 6});
  const nn::SequenceLayout plain = nn::packed_sequence(tokens, -1, false);
  EXPECT_FALSE(plain.documents.defined());
  EXPECT_EQ(plain.window, 6);
  const nn::SequenceLayout packed = nn::packed_sequence(tokens, 0, true);
  EXPECT_TRUE(at::equal(packed.documents, at::tensor({0, 0, 0, 1, 1, 2, 0, 0, 0, 0, 0, 0}, at::kLong).view({2, 6})));
  EXPECT_TRUE(at::equal(packed.positions, at::tensor({0, 1, 2, 0, 1, 0, 0, 1, 2, 3, 4, 5}, at::kLong).view({2, 6})));
  EXPECT_FALSE(nn::packed_sequence(tokens, 0, false).positions.defined());
}

}  // namespace
}  // namespace strata
