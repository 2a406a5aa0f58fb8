// Optimizers every job can use. [optimizer] name selects one; lr and schedule keys are core's.
#include "strata/plugin.h"

namespace strata::optimizers {
namespace {

void register_components(Registry& registry) {
  registry.add(std::make_unique<Component>(ComponentInfo{
      ComponentKind::Optimizer, "adamw", "AdamW with decoupled weight decay",
      Schema()
          .real("beta1", 0.9, "First-moment decay", between(0, 1))
          .real("beta2", 0.95, "Second-moment decay", between(0, 1))
          .real("eps", 1e-8, "Denominator stabiliser", at_least(0))
          .real("weight_decay", 0.1, "Decoupled weight decay", at_least(0))
          .boolean("decay_norms_and_biases", false, "Also decay norms, biases and embeddings")}));
  registry.add(std::make_unique<Component>(ComponentInfo{
      ComponentKind::Optimizer, "sgd", "SGD with momentum",
      Schema()
          .real("momentum", 0.9, "Momentum factor", between(0, 1))
          .boolean("nesterov", false, "Nesterov momentum")
          .real("weight_decay", 0.0, "L2 weight decay", at_least(0))}));
}

}  // namespace
}  // namespace strata::optimizers

STRATA_PLUGIN("optimizers", "0.1.0", strata::optimizers::register_components)
