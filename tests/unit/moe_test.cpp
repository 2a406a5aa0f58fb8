// The mixture-of-experts layer (plugins/models/moe_layer.cpp, compiled in) and what it stands on:
// ops::grouped_mm against a loop of matmuls, nn::add_auxiliary_loss against adding the loss, and
// the layer's routing, capacity and balance losses against a per-token reference written from
// the formulas in moe_layer.h.
#include <cmath>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "moe_layer.h"
#include "strata/core/local_communicator.h"

namespace strata::models {
namespace {

void expect_close(const at::Tensor& a, const at::Tensor& b, double tol, const std::string& what) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  const double diff = (a - b).abs().max().item<double>(), scale = b.abs().max().item<double>() + 1e-12;
  EXPECT_LE(diff / scale, tol) << what << ": max difference " << diff;
}

// ops::grouped_mm of random fp64 rows against one mm per group, output and gradients; returns dw.
at::Tensor check_grouped_mm_against_loop(const std::vector<int64_t>& sizes, uint64_t seed) {
  at::manual_seed(seed);
  int64_t rows = 0;
  for (int64_t n : sizes) rows += n;
  const auto groups = static_cast<int64_t>(sizes.size());
  at::Tensor x = at::randn({rows, 7}, at::kDouble).requires_grad_();
  at::Tensor w = at::randn({groups, 6, 7}, at::kDouble).requires_grad_();
  at::Tensor y = ops::grouped_mm(x, w, sizes);
  std::vector<at::Tensor> parts;
  for (int64_t g = 0, at_row = 0; g < groups; at_row += sizes[static_cast<size_t>(g)], ++g)
    parts.push_back(x.narrow(0, at_row, sizes[static_cast<size_t>(g)]).mm(w[g].t()));
  at::Tensor ref = at::cat(parts);
  expect_close(y, ref, 1e-12, "output");
  const at::Tensor dy = at::randn_like(y);
  const auto grads = torch::autograd::grad({y}, {x, w}, {dy});
  const auto ref_grads = torch::autograd::grad({ref}, {x, w}, {dy});
  expect_close(grads[0], ref_grads[0], 1e-12, "dx");
  expect_close(grads[1], ref_grads[1], 1e-12, "dw");
  return grads[1];
}

TEST(GroupedMm, EachGroupIsItsRowsTimesItsMatrixWithGradients) {
  // An empty group, and sizes not multiples of anything.
  const at::Tensor dw = check_grouped_mm_against_loop({3, 0, 5, 1}, 3);
  EXPECT_EQ(dw[1].abs().max().item<double>(), 0.0) << "a group without rows has a zero gradient";
}

// Groups of one size (experts padded to their capacity) take the reference's batched product.
TEST(GroupedMm, EqualGroupsAreOneBatchedProductWithGradients) { check_grouped_mm_against_loop({4, 4, 4}, 4); }

TEST(AuxiliaryLoss, BackwardAddsTheLossWithTheMicroBatchWeight) {
  at::Tensor p = at::randn({5}, at::kDouble).requires_grad_();
  const double scale = 0.25;  // e.g. loss scale 1 over 4 micro-batches
  auto grad_of = [&](bool injected) {
    const at::Tensor out = p * 3.0, aux = (p * p).sum();
    at::Tensor loss;
    {
      const nn::LossGradientScale weight(scale);
      if (injected) {
        (nn::add_auxiliary_loss(out, aux).sum() * scale).backward();
      } else {
        ((out.sum() + aux) * scale).backward();
      }
    }
    at::Tensor g = p.grad().clone();
    p.mutable_grad() = at::Tensor();
    return g;
  };
  expect_close(grad_of(true), grad_of(false), 1e-6, "gradient");
  EXPECT_EQ(nn::LossGradientScale::current(), 1.0) << "the scale is restored after the backward";
}

// One token through one expert, from the stacked weights: W2 (silu(W1 x) * W3 x).
at::Tensor expert_of(const GroupedExperts& experts, int64_t e, const at::Tensor& x) {
  const at::Tensor gate = experts.gate_proj->weight[e].mv(x), up = experts.up_proj->weight[e].mv(x);
  return experts.down_proj->weight[e].mv(at::silu(gate) * up);
}

struct Reference {
  at::Tensor out;
  int64_t dropped = 0;
  std::vector<int64_t> load;
  double aux = 0, z = 0;
};

// Token by token: top-k of the router's softmax (plus the layer's selection bias, if any), the
// chosen experts' probabilities renormalised as weights, choices taken choice-major against each
// expert's capacity (< 0: none).
Reference reference_moe(const MoeLayer& layer, const at::Tensor& tokens, int64_t k, int64_t capacity) {
  const int64_t n = tokens.size(0), e_count = layer.gate->weight.size(0);
  const at::Tensor logits = tokens.mm(layer.gate->weight.t()), probs = logits.softmax(-1);
  const at::Tensor idx = std::get<1>((layer.expert_bias.defined() ? probs + layer.expert_bias : probs).topk(k, -1));
  at::Tensor w = probs.gather(-1, idx);
  w = w / w.sum(-1, true);
  Reference r;
  r.out = at::zeros_like(tokens);
  r.load.assign(static_cast<size_t>(e_count), 0);
  std::vector<double> selections(static_cast<size_t>(e_count), 0);
  for (int64_t j = 0; j < k; ++j)
    for (int64_t t = 0; t < n; ++t) {
      const int64_t e = idx[t][j].item<int64_t>();
      selections[static_cast<size_t>(e)] += 1;
      if (capacity >= 0 && r.load[static_cast<size_t>(e)] >= capacity) {
        ++r.dropped;
        continue;
      }
      ++r.load[static_cast<size_t>(e)];
      r.out[t] += w[t][j] * expert_of(*layer.routed_experts, e, tokens[t]);
    }
  const at::Tensor mean_probs = probs.mean(0);
  for (int64_t e = 0; e < e_count; ++e)
    r.aux += static_cast<double>(e_count) * selections[static_cast<size_t>(e)] / static_cast<double>(n) * mean_probs[e].item<double>();
  r.z = logits.logsumexp(-1).pow(2).mean().item<double>();
  return r;
}

// What core reads of a layer's figures: its host figures and its device figures (the balance
// and z losses stay on the device until the step is read).
std::vector<std::pair<std::string, double>> reported(MoeLayer& layer) {
  std::vector<std::pair<std::string, double>> figures;
  layer.report_metrics(figures);
  std::vector<std::pair<std::string, at::Tensor>> on_device;
  layer.report_device_metrics(on_device);
  for (const auto& [name, value] : on_device) figures.emplace_back(name, value.item<double>());
  return figures;
}

double metric(const std::vector<std::pair<std::string, double>>& figures, const std::string& name) {
  for (const auto& [key, value] : figures)
    if (key == name) return value;
  ADD_FAILURE() << "no metric " << name;
  return 0;
}

void check_layer_against_reference(double capacity_factor, int64_t k, const std::string& expert_rows = "packed") {
  at::manual_seed(7);
  MoeSettings settings;
  settings.experts = 5, settings.top_k = k, settings.capacity_factor = capacity_factor, settings.expert_rows = expert_rows;
  MoeLayer layer(settings, 12, 20);
  const at::Tensor x = at::randn({2, 13, 12});  // 26 tokens
  at::Tensor out = layer.forward(x);
  const int64_t n = 26;
  const int64_t capacity =
      capacity_factor > 0 ? static_cast<int64_t>(std::ceil(capacity_factor * static_cast<double>(k * n) / 5.0)) : -1;
  at::NoGradGuard no_grad;
  const Reference ref = reference_moe(layer, x.reshape({n, 12}), k, capacity);
  expect_close(out.reshape({n, 12}), ref.out, 1e-5, "output");
  const std::vector<std::pair<std::string, double>> figures = reported(layer);
  EXPECT_NEAR(metric(figures, "moe_aux_loss"), ref.aux, 1e-5);
  EXPECT_NEAR(metric(figures, "moe_z_loss"), ref.z, 1e-4);
  EXPECT_NEAR(metric(figures, "moe_dropped_fraction"), static_cast<double>(ref.dropped) / static_cast<double>(k * n), 1e-12);
  for (size_t e = 0; e < 5; ++e) EXPECT_EQ(metric(figures, "moe_tokens_e" + std::to_string(e)), static_cast<double>(ref.load[e]));
  if (capacity > 0) EXPECT_GT(ref.dropped, 0) << "the capacity case must drop something to test dropping";
}

TEST(MoeLayer, DroplessRoutingMatchesTheTokenByTokenReference) { check_layer_against_reference(0.0, 2); }
TEST(MoeLayer, TopOneRoutingMatchesTheReference) { check_layer_against_reference(0.0, 1); }
TEST(MoeLayer, CapacityDropsTheSameAssignmentsAsTheReference) { check_layer_against_reference(0.6, 2); }
// Every expert padded to its capacity (static shapes): the same outputs, drops and figures.
TEST(MoeLayer, PaddedRowsMatchTheReference) {
  check_layer_against_reference(0.6, 2, "padded");
  check_layer_against_reference(1.5, 1, "padded");  // a capacity above every expert's load: empty slots only
}

TEST(MoeLayer, UniformRoutingGivesBalanceLossK) {
  MoeSettings settings;
  settings.experts = 4, settings.top_k = 2;
  MoeLayer layer(settings, 8, 16);
  {
    at::NoGradGuard no_grad;
    layer.gate->weight.zero_();  // every probability 1/4; topk then takes experts by index: f is not uniform
  }
  // With equal probabilities P_i = 1/E, so L_aux = E sum_i f_i / E = sum_i f_i = k whatever f is.
  layer.forward(at::randn({1, 10, 8}));
  EXPECT_NEAR(metric(reported(layer), "moe_aux_loss"), 2.0, 1e-6);
}

// The balance and z losses enter the gradient with their coefficients, as if added to the loss.
TEST(MoeLayer, AuxiliaryLossesReachTheRouterGradient) {
  MoeSettings with_losses;
  with_losses.experts = 4, with_losses.top_k = 2, with_losses.aux_loss_coef = 0.3, with_losses.z_loss_coef = 0.2;
  with_losses.moe_layers = 2;  // each layer's share is half
  MoeSettings without = with_losses;
  without.aux_loss_coef = 0, without.z_loss_coef = 0;
  at::manual_seed(11);
  MoeLayer a(with_losses, 8, 16);
  at::manual_seed(11);
  MoeLayer b(without, 8, 16);
  const at::Tensor x = at::randn({1, 9, 8});
  const double scale = 0.5;
  {
    const nn::LossGradientScale weight(scale);
    (a.forward(x).sum() * scale).backward();
  }
  at::Tensor out = b.forward(x);
  const at::Tensor logits = x.reshape({9, 8}).mm(b.gate->weight.t()), probs = logits.softmax(-1);
  const at::Tensor selections = at::bincount(std::get<1>(probs.topk(2, -1)).reshape(-1), {}, 4).to(at::kFloat);
  const at::Tensor aux = 4.0 * (selections / 9.0 * probs.mean(0)).sum();
  const at::Tensor z = logits.logsumexp(-1).pow(2).mean();
  ((out.sum() + 0.5 * (0.3 * aux + 0.2 * z)) * scale).backward();
  expect_close(a.gate->weight.grad(), b.gate->weight.grad(), 1e-5, "router gradient");
  expect_close(a.routed_experts->gate_proj->weight.grad(), b.routed_experts->gate_proj->weight.grad(), 1e-6, "expert gradient");
}

// DeepSeek-V3's bias: it changes which experts are chosen, not the chosen ones' weights.
TEST(MoeLayer, SelectionBiasPicksTheExpertsButNotTheirWeights) {
  at::manual_seed(13);
  MoeSettings settings;
  settings.experts = 5, settings.top_k = 2, settings.bias_balance = true;
  MoeLayer layer(settings, 12, 20);
  ASSERT_TRUE(layer.expert_bias.defined());
  {
    at::NoGradGuard no_grad;
    layer.expert_bias.copy_(at::tensor({0.3f, -0.2f, 0.0f, 0.1f, -0.05f}));
  }
  const at::Tensor x = at::randn({1, 21, 12});
  at::NoGradGuard no_grad;
  const Reference ref = reference_moe(layer, x.reshape({21, 12}), 2, -1);
  expect_close(layer.forward(x).reshape({21, 12}), ref.out, 1e-5, "output");
  for (auto name : layer.named_buffers()) EXPECT_EQ(name.key(), "expert_bias") << "the bias is the layer's only buffer";
}

// A router that sends most tokens to one expert: after each step the bias moves every expert by
// gamma towards the mean load, and the busiest expert's share falls towards uniform.
TEST(MoeLayer, BiasBalancingMovesLoadsTowardsUniform) {
  at::manual_seed(17);
  MoeSettings settings;
  settings.experts = 4, settings.top_k = 1, settings.bias_balance = true, settings.bias_update_rate = 0.01;
  MoeLayer layer(settings, 8, 16);
  at::Tensor x = at::randn({1, 64, 8}) * 0.2;
  {
    at::NoGradGuard no_grad;
    x.select(-1, 0).add_(1.0);
    layer.gate->weight.select(1, 0).copy_(at::tensor({1.5f, 0.0f, 0.0f, 0.0f}));  // expert 0 wins most tokens
  }
  const auto local = local_communicator();
  std::vector<double> ratios;
  for (int step = 0; step < 40; ++step) {
    layer.forward(x);
    layer.forward(x);  // two micro-batches: their loads add up
    layer.after_optimizer_step(*local);
    ratios.push_back(metric(reported(layer), "moe_max_load_ratio"));  // a device figure
  }
  EXPECT_GT(ratios.front(), 2.5) << "the skewed router must start unbalanced";
  // Sign steps of a fixed size end oscillating around balance (here 1.25 / 1.81 from 4).
  double last_ten = 0;
  for (size_t i = ratios.size() - 10; i < ratios.size(); ++i) last_ten += ratios[i] / 10;
  EXPECT_LT(last_ten, 1.75) << "the busiest expert's load over the mean, averaged over the last 10 updates";
  EXPECT_LT(layer.expert_bias[0].item<double>(), 0.0) << "the busy expert's bias went down";
  at::NoGradGuard no_grad;
  const at::Tensor no_training = layer.expert_bias.clone();
  layer.forward(x);  // an evaluation forward counts no load
  layer.after_optimizer_step(*local);
  EXPECT_TRUE(layer.expert_bias.equal(no_training));
}

TEST(MoeLayer, SharedExpertsAddADenseSwiGlu) {
  MoeSettings settings;
  settings.experts = 3, settings.top_k = 1, settings.shared_experts = 2;
  at::manual_seed(5);
  MoeLayer layer(settings, 8, 16);
  ASSERT_TRUE(layer.shared_experts);
  EXPECT_EQ(layer.shared_experts->gate_proj->weight.size(0), 32) << "two experts' widths";
  at::NoGradGuard no_grad;
  const at::Tensor x = at::randn({7, 8});
  const Reference routed = reference_moe(layer, x, 1, -1);
  expect_close(layer.forward(x.unsqueeze(0)).squeeze(0), routed.out + layer.shared_experts->forward(x), 1e-5, "output");
}

}  // namespace
}  // namespace strata::models
