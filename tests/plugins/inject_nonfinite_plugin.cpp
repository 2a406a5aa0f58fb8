// Test plugin: after the gradients of one step are computed (and reduced), makes one gradient
// element on one data-parallel rank (and, if given, one pipeline stage) infinite, as an fp16 overflow would, so tests can check that
// amp skips exactly that step on every rank.
#include <limits>

#include <ATen/ATen.h>

#include "strata/plugin.h"

namespace {

using namespace strata;

class InjectNonfinite final : public Pass {
 public:
  InjectNonfinite()
      : Pass({ComponentKind::Pass, "inject_nonfinite", "Test only: an infinite gradient element at one step",
              Schema()
                  .integer("step", 1, "Optimizer step whose gradient is made infinite", at_least(1))
                  .integer("rank", 0, "Data-parallel rank that gets it", at_least(0))
                  .integer("pipeline_rank", -1, "Pipeline rank (stage) that gets it; -1: every stage", at_least(-1))},
             // Before amp, so amp's check sees the injected value.
             {Phase::Topology, {}, {}, {}, {}}, {{}, {{Stage::Gradients, StageUse::Wrap}}}) {}

  void apply(Job& job, const Config& config) const override {
    const int64_t step = config.get_int("step"), rank = config.get_int("rank"), stage = config.get_int("pipeline_rank");
    job.program.wrap(Stage::Gradients, [&job, step, rank, stage](StepContext& context, const StageFn& inner) {
      inner(context);
      if (context.step == step && job.topology->rank_in(Dim::Data) == rank &&
          (stage < 0 || job.topology->rank_in(Dim::Pipeline) == stage))
        for (auto& [g, placement] : job.local_gradients())
          if (g.defined() && g.numel() > 0) {
            at::NoGradGuard no_grad;
            g.view(-1)[0].fill_(std::numeric_limits<double>::infinity());
            break;
          }
    });
  }
};

void register_components(Registry& registry) { registry.add(std::make_unique<InjectNonfinite>()); }

}  // namespace

STRATA_PLUGIN("inject_nonfinite", "1.0.0", register_components)
