// Every reference operator against a plain ATen composition written from the formula: values
// and gradients, in double precision.
#include <cmath>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "strata/errors.h"
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
void register_triple_again(Registry& registry) { registry.add(ops::define_operator<Triple>("again", &triple)); }
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

TEST(OperatorTable, OperatorDefinedTwiceOrWithAnotherTypeIsRefused) {
  ComponentRegistry twice;
  twice.register_plugin(PluginRecord{"triple", "0", "<test>", "", {}}, &register_triple);
  OperatorTable::global().install(twice);
  ComponentRegistry again;
  again.register_plugin(PluginRecord{"again", "0", "<test>", "", {}}, &register_triple_again);
  try {
    OperatorTable::global().install(again);
    FAIL() << "accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("operator 'triple' is defined by plugin 'again' and by plugin 'triple'"), std::string::npos) << e.what();
  }
  ComponentRegistry odd;
  odd.register_plugin(PluginRecord{"odd", "0", "<test>", "", {}}, &register_triple_other_type);
  try {
    OperatorTable::global().install(odd);
    FAIL() << "accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("'triple.odd' from plugin 'odd' has another function type"), std::string::npos) << e.what();
  }
  OperatorTable::global().reset();
}

}  // namespace
}  // namespace strata
