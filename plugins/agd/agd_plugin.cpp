// AGD (auto-switchable optimizer with stepwise gradient difference, NeurIPS 2023), following
// ../shared/specs/optimizers.md as written up in docs/optimizers.md. The update itself is the
// agd_update operator, so a faster implementation for a device replaces it without touching
// this file; this plugin also registers the fused CPU one.
//
// Gated steps (amp's fp16 non-finite check, strata/optimizer.h's GatedOptimizer): a flag in host
// memory (the CPU) is branched on. On a device the step count t, on which the bias corrections
// depend, cannot be a host value (a skipped step does not count, and reading the flag is what
// gating avoids), so the gated step keeps t on the device as AdamW does and runs the
// reference's formulas (core/src/ir/ops_reference.cpp, agd_update_reference) with the
// corrections as device scalars, out of place, keeping the old values where the flag is set
// (at::where). The agd_update operator takes t as a host value (ops::AgdHyper), so its fused
// kernels serve ungated steps only.
#include <ATen/ATen.h>

#include "agd_fused_cpu.h"
#include "strata/plugin.h"

namespace strata::agd {
namespace {

struct Slots {
  at::Tensor exp_avg, exp_avg_diff_sq, max_exp_avg_diff_sq, z;
};

class Agd final : public Optimizer, public GatedOptimizer {
 public:
  Agd(std::vector<ParamGroup> groups, const Config& c) : groups_(std::move(groups)), step_(at::zeros({}, at::kLong)) {
    hyper_.beta1 = c.get_float("beta1");
    hyper_.beta2 = c.get_float("beta2");
    hyper_.delta = c.get_float("delta");
    hyper_.clip = c.get_float("clip");
    hyper_.weight_decouple = c.get_bool("weight_decouple");
    hyper_.fixed_decay = c.get_bool("fixed_decay");
    hyper_.amsgrad = c.get_bool("amsgrad");
    hyper_.win = c.get_bool("win");
    at::NoGradGuard no_grad;
    for (const auto& g : groups_)
      for (size_t i = 0; i < g.params.size(); ++i) {
        const at::Tensor& p = g.params[i];
        auto zeros = [&] { return at::zeros_like(p, at::MemoryFormat::Contiguous); };
        Slots s{zeros(), zeros(), {}, {}};
        const std::string& name = g.names[i];
        named_.emplace_back(name + ".exp_avg", s.exp_avg);
        named_.emplace_back(name + ".exp_avg_diff_sq", s.exp_avg_diff_sq);
        if (hyper_.amsgrad) named_.emplace_back(name + ".max_exp_avg_diff_sq", s.max_exp_avg_diff_sq = zeros());
        // Win's extrapolation sequence starts at the initial parameters (z0 = theta0).
        if (hyper_.win) named_.emplace_back(name + ".z", s.z = p.detach().clone(at::MemoryFormat::Contiguous));
        slots_.push_back(std::move(s));
      }
  }

  void step(double lr) override {
    at::NoGradGuard no_grad;
    take_device_step();
    step_ += 1;
    ops::AgdHyper h = hyper_;
    h.step = step_.item<int64_t>();
    h.lr = lr;
    size_t index = 0;
    for (auto& g : groups_) {
      h.weight_decay = g.weight_decay;
      for (auto& p : g.params) {
        const Slots& s = slots_[index++];
        if (!p.grad().defined()) continue;
        ops::agd_update(p, p.grad(), s.exp_avg, s.exp_avg_diff_sq, s.max_exp_avg_diff_sq, s.z, h);
      }
    }
  }

  void step_unless(double lr, const at::Tensor& skip) override {
    if (gate_flag_on_host(skip)) {
      if (skip.item<double>() == 0) step(lr);
      return;
    }
    at::NoGradGuard no_grad;
    const at::Tensor skipped = skip.ne(0).reshape({});
    if (!device_step_.defined()) device_step_ = at::full({}, step_.item<int64_t>(), skipped.options().dtype(at::kLong));
    const Corrections c(hyper_, device_step_ + 1, lr);
    size_t index = 0;
    for (auto& g : groups_)
      for (auto& p : g.params) {
        Slots& s = slots_[index++];
        if (!p.grad().defined()) continue;
        TORCH_CHECK(p.device() == skipped.device(), "agd: a gated step's flag is on ", skipped.device(), ", parameters on ", p.device());
        gated_update(p, p.grad(), s, g.weight_decay, lr, c, skipped);
      }
    device_step_.add_(skipped.logical_not().to(at::kLong));
  }

  NamedTensors state_tensors() override {
    NamedTensors out{{"step", device_step_.defined() ? device_step_ : step_}};
    out.insert(out.end(), named_.begin(), named_.end());
    return out;
  }

 private:
  // The bias corrections of step t (a 0-dim long tensor on the device) as 0-dim double tensors
  // there: c1 = 1 - beta1^t, 1 / c1_prev (0 at t = 1, where the reference skips that term),
  // sqrt(c2), and the step size a = lr sqrt(c2) / c1.
  struct Corrections {
    Corrections(const ops::AgdHyper& h, const at::Tensor& step, double lr) {
      const at::Tensor t = step.to(at::kDouble);
      c1 = 1.0 - at::pow(h.beta1, t);
      const at::Tensor c1_prev = 1.0 - at::pow(h.beta1, t - 1.0);
      inv_c1_prev = at::where(t.gt(1.0), c1_prev.reciprocal(), at::zeros_like(t));
      sqrt_c2 = (1.0 - at::pow(h.beta2, t)).sqrt();
      a = lr * sqrt_c2 / c1;
    }
    at::Tensor c1, inv_c1_prev, sqrt_c2, a;
  };

  // One gated AGD step of one parameter: the reference's formulas with the corrections `c`,
  // computed out of place and written back where `skipped` (a 0-dim bool) is false.
  void gated_update(const at::Tensor& param, const at::Tensor& grad, Slots& s, double weight_decay, double lr, const Corrections& c,
                    const at::Tensor& skipped) const {
    const ops::AgdHyper& h = hyper_;
    auto keep = [&](const at::Tensor& state, const at::Tensor& next) { state.copy_(at::where(skipped, state, next)); };
    at::Tensor g = grad, p = param;
    if (!h.win && weight_decay != 0) {
      if (h.weight_decouple) p = param * (1.0 - (h.fixed_decay ? 1.0 : lr) * weight_decay);
      else g = grad + weight_decay * param;
    }
    const at::Tensor m = s.exp_avg * h.beta1 + g * (1.0 - h.beta1);
    const at::Tensor d = m / c.c1 - s.exp_avg * c.inv_c1_prev;
    const at::Tensor v = s.exp_avg_diff_sq * h.beta2 + d * d * (1.0 - h.beta2);
    at::Tensor b = v;
    if (h.amsgrad) {
      b = at::maximum(s.max_exp_avg_diff_sq, v);
      keep(s.max_exp_avg_diff_sq, b);
    }
    at::Tensor u = m / at::clamp_min(b.sqrt(), h.delta * c.sqrt_c2);
    if (h.clip > 0) u = u.clamp(-h.clip, h.clip);
    keep(s.exp_avg, m);
    keep(s.exp_avg_diff_sq, v);
    if (!h.win) return keep(param, p - c.a * u);
    const at::Tensor z = (s.z - c.a * u) / (1.0 + weight_decay * c.a);
    const at::Tensor tau = 1.0 / (3.0 + 2.0 * weight_decay * c.a);
    keep(s.z, z);
    keep(param, param * tau - u * (2.0 * tau * c.a) + z * (2.0 * tau));
  }

  // An ungated step after gated ones on a device (not within one run): the device's count back
  // into the host's step (one counted read), the count again from here on.
  void take_device_step() {
    if (!device_step_.defined()) return;
    step_.fill_(static_cast<int64_t>(read_on_host({device_step_})[0]));
    device_step_ = at::Tensor();
  }

  std::vector<ParamGroup> groups_;
  ops::AgdHyper hyper_;
  at::Tensor step_;         // updates taken (checkpointed until gated steps run on a device)
  at::Tensor device_step_;  // from the first gated step on a device: updates taken, there (checkpointed)
  std::vector<Slots> slots_;
  NamedTensors named_;
};

class AgdFactory final : public OptimizerFactory {
 public:
  using OptimizerFactory::OptimizerFactory;
  std::unique_ptr<Optimizer> create(std::vector<ParamGroup> groups, const Config& config) const override {
    return std::make_unique<Agd>(std::move(groups), config);
  }
};

void register_components(Registry& registry) {
  registry.add(std::make_unique<AgdFactory>(ComponentInfo{
      ComponentKind::Optimizer, "agd",
      "AGD: stepwise gradient difference as preconditioner, switching per coordinate between SGD-momentum and adaptive "
      "steps (use about 1/10 of AdamW's lr)",
      Schema()
          .real("beta1", 0.9, "First-moment decay", between(0, 1))
          .real("beta2", 0.999, "Decay of the second moment of the gradient difference", between(0, 1))
          .real("delta", 1e-5, "Switch threshold: where sqrt(b_hat) <= delta the step is SGD with momentum (1e-14 suits Transformers)",
                at_least(0))
          .boolean("weight_decouple", true, "Decoupled (AdamW-style) weight decay; false adds decay * param to the gradient")
          .boolean("fixed_decay", false, "Decoupled decay not scaled by the learning rate")
          .boolean("amsgrad", false, "Use the running maximum of b")
          .boolean("win", false, "Win acceleration (weight decay then enters through z and tau only)")
          .real("clip", 0.0, "Clamp the normalised update to [-clip, clip]; 0 = no clamp (5 when training is unstable)",
                at_least(0))}));
  registry.add(std::make_unique<ops::OperatorImpl<ops::AgdUpdate>>(
      "agd_update.cpu_fused", "AGD step in one pass over each tensor (CPU, fp32/fp64)", &agd_update_fused_cpu,
      ops::Support{{c10::DeviceType::CPU}, {at::kFloat, at::kDouble}}, 10));
}

}  // namespace
}  // namespace strata::agd

STRATA_PLUGIN("agd", "0.1.0", strata::agd::register_components)
