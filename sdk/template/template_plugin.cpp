// A minimal Strata plugin: one pass, "template_pass", with one config key. It reports the
// global L2 norm of the parameters every `every` steps (metric "param_norm" in metrics.jsonl),
// which is enough to show the three things every pass does: declare its keys, apply itself to
// the job, and hook into the step program. Copy this directory to start a plugin.
#include <ATen/ATen.h>

#include "strata/plugin.h"

namespace template_plugin {
namespace {

class TemplatePass final : public strata::Pass {
 public:
  TemplatePass()
      : Pass({strata::ComponentKind::Pass, "template_pass", "Reports the parameter norm every few steps",
              strata::Schema().integer("every", 1, "Report every this many steps", strata::at_least(1))},
             // Runtime phase, no requirements or conflicts.
             {strata::Phase::Runtime, {}, {}, {}, {}}) {}

  void apply(strata::Job& job, const strata::Config& config) const override {
    const int64_t every = config.get_int("every");
    auto model = job.model;
    job.add_hook(strata::HookPoint::AfterStep, [model, every](strata::StepContext& context) {
      if (context.step % every != 0) return;
      at::NoGradGuard no_grad;
      double squared = 0;
      for (const auto& p : model->parameters()) squared += p.detach().to(at::kDouble).square().sum().item<double>();
      context.metrics.emplace_back("param_norm", std::sqrt(squared));
    });
  }
};

void register_components(strata::Registry& registry) { registry.add(std::make_unique<TemplatePass>()); }

}  // namespace
}  // namespace template_plugin

STRATA_PLUGIN("template", "0.1.0", template_plugin::register_components)
