// Example pass "ema": an exponential moving average of the weights, updated after every
// optimizer step, shadow <- decay * shadow + (1 - decay) * weight. The averages are registered
// as job state, so checkpoints save them under "ema/<parameter>" and --resume restores them.
#include <ATen/ATen.h>

#include "strata/plugin.h"

namespace ema_example {
namespace {

class Averages final : public strata::Stateful {
 public:
  Averages(std::shared_ptr<strata::nn::Model> model, double decay) : decay_(decay) {
    at::NoGradGuard no_grad;
    for (const auto& p : model->named_parameters()) {
      names_.push_back(p.key());
      weights_.push_back(p.value());
      // The average starts at the initial weights (after any broadcast by earlier passes).
      shadows_.push_back(p.value().detach().clone());
    }
  }

  void update() {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < weights_.size(); ++i) shadows_[i].lerp_(weights_[i], 1.0 - decay_);
  }

  strata::NamedTensors save() const override {
    strata::NamedTensors out;
    for (size_t i = 0; i < names_.size(); ++i) out.emplace_back(names_[i], shadows_[i]);
    return out;
  }

  void load(const strata::NamedTensors& tensors) override {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < names_.size(); ++i) {
      auto it = std::find_if(tensors.begin(), tensors.end(), [&](const auto& t) { return t.first == names_[i]; });
      if (it == tensors.end() || it->second.sizes() != shadows_[i].sizes())
        throw strata::UserError("checkpoint has no matching ema average for '" + names_[i] + "'");
      shadows_[i].copy_(it->second);
    }
  }

 private:
  double decay_;
  std::vector<std::string> names_;
  std::vector<at::Tensor> weights_, shadows_;
};

class EmaPass final : public strata::Pass {
 public:
  EmaPass()
      : Pass({strata::ComponentKind::Pass, "ema", "Exponential moving average of the weights, saved in checkpoints",
              strata::Schema().real("decay", 0.999, "Weight of the old average at each step", strata::between(0, 1))},
             // After the passes that change or broadcast the weights.
             {strata::Phase::Runtime, {}, {}, {"ddp"}, {}}) {}

  void apply(strata::Job& job, const strata::Config& config) const override {
    auto averages = std::make_shared<Averages>(job.model, config.get_float("decay"));
    job.add_hook(strata::HookPoint::AfterStep, [averages](strata::StepContext& context) {
      if (!context.skip_step) averages->update();
    });
    job.register_state("ema", averages);
  }
};

void register_components(strata::Registry& registry) { registry.add(std::make_unique<EmaPass>()); }

}  // namespace
}  // namespace ema_example

STRATA_PLUGIN("ema", "0.1.0", ema_example::register_components)
