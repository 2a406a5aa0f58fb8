// Test plugin: gives the model's first block a parameter its forward never reads, as a model with
// an unused branch would, so tests can check what each data-parallel pass does about it.
#include <ATen/ATen.h>

#include "strata/plugin.h"

namespace {

using namespace strata;

class UnusedParameter final : public Pass {
 public:
  UnusedParameter()
      : Pass({ComponentKind::Pass, "unused_parameter", "Test only: a parameter of block 0 that gets no gradient", Schema()},
             // Before the data-parallel passes collect the parameters.
             {Phase::ModelRewrite, {}, {}, {}, {}}) {}

  void apply(Job& job, const Config&) const override { job.model->block(0).register_parameter("unused", at::zeros({8})); }
};

void register_components(Registry& registry) { registry.add(std::make_unique<UnusedParameter>()); }

}  // namespace

STRATA_PLUGIN("unused_parameter", "1.0.0", register_components)
