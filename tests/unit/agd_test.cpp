// AGD against an independent scalar transcription of docs/optimizers.md, for each option and
// both implementations of the agd_update operator (the fused CPU loop and core's reference).
#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "bundled_plugins.h"
#include "strata/core/operator_table.h"
#include "strata/optimizer.h"

namespace strata {
namespace {

struct Options {
  std::string label;
  double beta1 = 0.9, beta2 = 0.999, delta = 1e-5, weight_decay = 0.0, clip = 0.0;
  bool weight_decouple = true, fixed_decay = false, amsgrad = false, win = false;
};

void PrintTo(const Options& o, std::ostream* os) { *os << o.label; }

// The update rule one coordinate at a time, in double precision, straight from the formulas.
class ScalarAgd {
 public:
  ScalarAgd(const Options& o, std::vector<double> theta)
      : o_(o), m_(theta.size()), b_(theta.size()), b_max_(theta.size()), z_(theta), theta_(std::move(theta)) {}

  void step(const std::vector<double>& grad, double lr, double weight_decay) {
    ++t_;
    const double c1 = 1 - std::pow(o_.beta1, t_), c1_prev = 1 - std::pow(o_.beta1, t_ - 1), c2 = 1 - std::pow(o_.beta2, t_);
    for (size_t i = 0; i < theta_.size(); ++i) {
      double th = theta_[i], g = grad[i];
      if (!o_.win && weight_decay != 0) {
        if (!o_.weight_decouple) g += weight_decay * th;
        else th *= o_.fixed_decay ? 1 - weight_decay : 1 - lr * weight_decay;
      }
      const double m_prev = m_[i];
      m_[i] = o_.beta1 * m_[i] + (1 - o_.beta1) * g;
      const double s = t_ == 1 ? m_[i] / c1 : m_[i] / c1 - m_prev / c1_prev;
      b_[i] = o_.beta2 * b_[i] + (1 - o_.beta2) * s * s;
      b_max_[i] = std::max(b_max_[i], b_[i]);
      const double d = std::max(std::sqrt(o_.amsgrad ? b_max_[i] : b_[i]), o_.delta * std::sqrt(c2));
      double u = m_[i] / d;
      if (o_.clip > 0) u = std::clamp(u, -o_.clip, o_.clip);
      const double a = lr * std::sqrt(c2) / c1;
      if (o_.win) {
        z_[i] = (z_[i] - a * u) / (1 + weight_decay * a);
        const double tau = 1 / (3 + 2 * a * weight_decay);
        th = tau * th - 2 * tau * a * u + 2 * tau * z_[i];
      } else {
        th -= a * u;
      }
      theta_[i] = th;
    }
  }
  const std::vector<double>& theta() const { return theta_; }

 private:
  Options o_;
  int t_ = 0;
  std::vector<double> m_, b_, b_max_, z_, theta_;
};

std::unique_ptr<Optimizer> make_agd(const Options& o, std::vector<ParamGroup> groups) {
  const auto* factory = dynamic_cast<const OptimizerFactory*>(test::bundled().find(ComponentKind::Optimizer, "agd"));
  EXPECT_NE(factory, nullptr);
  return factory->create(std::move(groups), test::config_for(*factory, {{"beta1", o.beta1}, {"beta2", o.beta2},
                                                                        {"delta", o.delta}, {"clip", o.clip},
                                                                        {"weight_decouple", o.weight_decouple},
                                                                        {"fixed_decay", o.fixed_decay},
                                                                        {"amsgrad", o.amsgrad}, {"win", o.win}}));
}

std::vector<double> values(const at::Tensor& t) {
  at::Tensor c = t.detach().to(at::kDouble).contiguous();
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}

double lr_at(int step) { return 1e-2 * (1.0 + 0.5 * std::cos(step)); }

enum class Impl { Fused, Reference };

class Agd : public ::testing::TestWithParam<std::tuple<Options, Impl>> {
 protected:
  void SetUp() override {
    OperatorTable::global().reset();
    if (std::get<1>(GetParam()) == Impl::Fused) OperatorTable::global().install(test::bundled());
  }
  void TearDown() override { OperatorTable::global().reset(); }
};

// Two groups (decayed and not), 60 steps of random gradients and a varying learning rate.
TEST_P(Agd, FollowsTheFormulas) {
  const Options o = std::get<0>(GetParam());
  const std::string expected_impl = std::get<1>(GetParam()) == Impl::Fused ? "agd_update.cpu_fused" : "agd_update.reference";
  at::manual_seed(3);
  at::Tensor decayed = at::randn({7, 13}, at::kDouble).requires_grad_(true), plain = at::randn({5}, at::kDouble).requires_grad_(true);
  ASSERT_EQ(OperatorTable::global().select("agd_update", decayed).name(), expected_impl);
  const double wd = o.weight_decay;
  auto optimizer = make_agd(o, {ParamGroup{{"w"}, {decayed}, wd}, ParamGroup{{"b"}, {plain}, 0.0}});
  ScalarAgd want_decayed(o, values(decayed)), want_plain(o, values(plain));
  for (int step = 1; step <= 60; ++step) {
    // Gradients with a persistent part, so both the adaptive and the momentum regimes occur.
    decayed.mutable_grad() = at::randn({7, 13}, at::kDouble) * 0.1 + 0.05;
    plain.mutable_grad() = at::randn({5}, at::kDouble) * 1e-6;
    want_decayed.step(values(decayed.grad()), lr_at(step), wd);
    want_plain.step(values(plain.grad()), lr_at(step), 0.0);
    optimizer->step(lr_at(step));
    for (auto [got, want] : {std::pair{values(decayed), want_decayed.theta()}, std::pair{values(plain), want_plain.theta()}})
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 1e-12 * (1 + std::abs(want[i]))) << o.label << " step " << step << " element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Options, Agd,
    ::testing::Combine(
        ::testing::Values(Options{.label = "defaults"}, Options{.label = "decoupled_decay", .weight_decay = 0.1},
                          Options{.label = "fixed_decay", .weight_decay = 0.01, .fixed_decay = true},
                          Options{.label = "coupled_decay", .weight_decay = 0.1, .weight_decouple = false},
                          Options{.label = "amsgrad", .weight_decay = 0.1, .amsgrad = true},
                          Options{.label = "win", .weight_decay = 0.1, .win = true},
                          Options{.label = "win_amsgrad_clip", .weight_decay = 0.05, .clip = 0.5, .amsgrad = true, .win = true},
                          Options{.label = "clip_large_delta", .delta = 1e-2, .clip = 0.3},
                          Options{.label = "transformer_delta", .beta2 = 0.99, .delta = 1e-14}),
        ::testing::Values(Impl::Fused, Impl::Reference)),
    [](const auto& info) {
      return std::get<0>(info.param).label + (std::get<1>(info.param) == Impl::Fused ? "_fused" : "_reference");
    });

// The auto switch: where sqrt(b_hat) <= delta the step is SGD with momentum, lr/delta * m_hat;
// elsewhere it is the adaptive lr * m_hat / sqrt(b_hat).
TEST(AgdSwitch, ClampedCoordinatesStepAsSgdWithMomentum) {
  OperatorTable::global().install(test::bundled());
  const Options o{.label = "switch", .beta1 = 0.9, .beta2 = 0.5, .delta = 1e-3};
  at::Tensor theta = at::zeros({2}, at::kDouble).requires_grad_(true);
  auto optimizer = make_agd(o, {ParamGroup{{"theta"}, {theta}, 0.0}});
  const double lr = 1e-2;
  double m[2] = {0, 0}, b[2] = {0, 0}, m_prev_hat[2] = {0, 0};
  int momentum_steps = 0, adaptive_steps = 0;
  for (int t = 1; t <= 40; ++t) {
    // Coordinate 0: a constant gradient, whose bias-corrected moment stops changing, so b decays
    // to nothing; coordinate 1: an alternating one, whose moment keeps changing.
    const double g[2] = {0.5, t % 2 ? 1.0 : -1.0};
    theta.mutable_grad() = at::tensor({g[0], g[1]}, at::kDouble);
    const std::vector<double> before = values(theta);
    optimizer->step(lr);
    const std::vector<double> after = values(theta);
    const double c1 = 1 - std::pow(o.beta1, t), c2 = 1 - std::pow(o.beta2, t);
    for (int i = 0; i < 2; ++i) {
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g[i];
      const double s = m[i] / c1 - m_prev_hat[i];
      m_prev_hat[i] = m[i] / c1;
      b[i] = o.beta2 * b[i] + (1 - o.beta2) * s * s;
      const double b_hat_sqrt = std::sqrt(b[i] / c2), m_hat = m[i] / c1;
      const double step = before[i] - after[i];
      if (b_hat_sqrt <= o.delta) {
        EXPECT_NEAR(step, lr / o.delta * m_hat, 1e-12) << "t " << t << " coordinate " << i;
        ++momentum_steps;
        EXPECT_EQ(i, 0) << "the alternating coordinate should stay adaptive";
      } else {
        EXPECT_NEAR(step, lr * m_hat / b_hat_sqrt, 1e-12) << "t " << t << " coordinate " << i;
        ++adaptive_steps;
      }
    }
  }
  // The constant coordinate switched after about 20 steps; both regimes were exercised.
  EXPECT_GT(momentum_steps, 10);
  EXPECT_GT(adaptive_steps, 40);
  OperatorTable::global().reset();
}

// Fused and reference in fp32 agree to rounding after many steps.
TEST(AgdFused, MatchesReferenceInFloat) {
  const Options o{.label = "fp32", .weight_decay = 0.1, .amsgrad = true};
  at::manual_seed(5);
  at::Tensor init = at::randn({4099}, at::kFloat);
  at::Tensor fused = init.clone().requires_grad_(true), reference = init.clone().requires_grad_(true);
  auto fused_optimizer = make_agd(o, {ParamGroup{{"p"}, {fused}, 0.1}});
  auto reference_optimizer = make_agd(o, {ParamGroup{{"p"}, {reference}, 0.1}});
  for (int step = 1; step <= 50; ++step) {
    at::Tensor grad = at::randn({4099}, at::kFloat) * 0.1 + 0.02;
    fused.mutable_grad() = grad.clone();
    reference.mutable_grad() = grad.clone();
    OperatorTable::global().install(test::bundled());
    fused_optimizer->step(lr_at(step));
    OperatorTable::global().reset();
    reference_optimizer->step(lr_at(step));
  }
  const double difference = (fused - reference).abs().max().item<double>();
  EXPECT_LT(difference, 1e-5 * init.abs().max().item<double>()) << difference;
  EXPECT_GT((fused - init).abs().max().item<double>(), 1e-3) << "the parameters should have moved";
}

// Saving the state tensors and loading them into a fresh optimizer continues bit for bit.
TEST(AgdState, RestoresExactly) {
  OperatorTable::global().install(test::bundled());
  const Options o{.label = "state", .weight_decay = 0.1, .amsgrad = true, .win = true};
  at::manual_seed(9);
  at::Tensor a = at::randn({33}, at::kFloat).requires_grad_(true);
  auto first = make_agd(o, {ParamGroup{{"a"}, {a}, 0.1}});
  std::vector<at::Tensor> grads;
  for (int i = 0; i < 20; ++i) grads.push_back(at::randn({33}, at::kFloat));
  for (int step = 0; step < 10; ++step) a.mutable_grad() = grads[step], first->step(lr_at(step));

  at::Tensor b = a.detach().clone().requires_grad_(true);
  auto second = make_agd(o, {ParamGroup{{"a"}, {b}, 0.1}});
  NamedTensors saved = first->state_tensors(), fresh = second->state_tensors();
  ASSERT_EQ(saved.size(), 5u);  // step, exp_avg, exp_avg_diff_sq, max_exp_avg_diff_sq, z
  for (size_t i = 0; i < saved.size(); ++i) {
    ASSERT_EQ(saved[i].first, fresh[i].first);
    fresh[i].second.copy_(saved[i].second);
  }
  for (int step = 10; step < 20; ++step) {
    a.mutable_grad() = grads[step], first->step(lr_at(step));
    b.mutable_grad() = grads[step], second->step(lr_at(step));
  }
  EXPECT_TRUE(at::equal(a, b));
  OperatorTable::global().reset();
}

}  // namespace
}  // namespace strata
