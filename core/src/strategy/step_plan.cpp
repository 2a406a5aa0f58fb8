#include "strata/core/step_plan.h"

#include <algorithm>

#include "strata/pass.h"

namespace strata {

const char* core_stage_description(Stage stage) {
  switch (stage) {
    case Stage::PrepareBatches: return "each micro-batch of the global batch, sliced by data rank";
    case Stage::Gradients: return "forward_backward, then sync_gradients";
    case Stage::ForwardBackward: return "micro-batches in sequence: forward, loss, backward each";
    case Stage::SyncGradients: return "nothing (gradients are local)";
    case Stage::ClipGradients: return "global 2-norm of the gradients, clipped to [optimizer] grad_clip";
    case Stage::OptimizerStep: return "the [optimizer] update, unless a hook set skip_step or a pass's device flag says skip";
    case Stage::Evaluate: return "validation batches through the training forward and loss, without gradients";
  }
  return "?";
}

StepProgram planned_step_program(const ResolvedStrategy& plan, const std::vector<size_t>& order) {
  StepProgram program;
  for (Stage stage : kAllStages) program.provide(stage, core_stage_description(stage), [](StepContext&) {});
  for (size_t i : order) {
    const Pass& pass = *plan.passes[i].pass;
    program.begin_pass(pass.name(), pass.claims());
    for (const StageClaim& claim : pass.claims().stages) {
      if (claim.use == StageUse::Own)
        program.own(claim.stage, [](StepContext&) {});
      else
        program.wrap(claim.stage, [](StepContext& c, const StageFn& inner) { inner(c); });
    }
    program.end_pass();
  }
  return program;
}

std::string describe_step_program(const StepProgram& program, const std::string& indent) {
  std::string out;
  for (Stage stage : kAllStages) {
    const bool nested = stage == Stage::ForwardBackward || stage == Stage::SyncGradients;
    std::string name = (nested ? "  " : "") + std::string(stage_name(stage));
    name.resize(std::max<size_t>(name.size() + 2, 20), ' ');
    std::string provider = program.provider(stage);
    if (provider.rfind("core: ", 0) != 0) provider = "pass " + provider;
    out += indent + name + provider;
    const std::vector<std::string> wrappers = program.wrappers(stage);
    if (!wrappers.empty()) {
      out += "; wrapped by ";
      for (size_t w = 0; w < wrappers.size(); ++w) out += (w ? ", then " : "") + wrappers[w];
    }
    out += "\n";
  }
  return out;
}

}  // namespace strata
