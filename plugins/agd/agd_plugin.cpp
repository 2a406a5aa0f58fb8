// AGD (auto-switchable optimizer with stepwise gradient difference, NeurIPS 2023), following
// ../shared/specs/optimizers.md as written up in docs/optimizers.md. The update itself is the
// agd_update operator, so a faster implementation for a device replaces it without touching
// this file; this plugin also registers the fused CPU one.
#include <ATen/ATen.h>

#include "agd_fused_cpu.h"
#include "strata/plugin.h"

namespace strata::agd {
namespace {

struct Slots {
  at::Tensor exp_avg, exp_avg_diff_sq, max_exp_avg_diff_sq, z;
};

class Agd final : public Optimizer {
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

  NamedTensors state_tensors() override {
    NamedTensors out{{"step", step_}};
    out.insert(out.end(), named_.begin(), named_.end());
    return out;
  }

 private:
  std::vector<ParamGroup> groups_;
  ops::AgdHyper hyper_;
  at::Tensor step_;
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
