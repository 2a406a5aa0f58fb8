// Activation checkpointing: recompute selected blocks in backward instead of storing activations.
#include "strata/not_built.h"
#include "strata/plugin.h"

namespace strata::act_checkpoint {
namespace {

class ActCheckpointPass final : public Pass {
 public:
  // Before fsdp so that recomputation happens inside a unit, after its all-gather.
  ActCheckpointPass()
      : Pass({ComponentKind::Pass, "act_checkpoint", "Recompute activations of selected blocks during backward",
              Schema()
                  .strings("blocks", {"block"}, "Block types or names to checkpoint")
                  .integer("every", 1, "Checkpoint every k-th matching block", at_least(1))},
             {Phase::Wrapping, {}, {}, {}, {"fsdp", "ddp", "zero1", "zero2"}}) {}

  void apply(Job&, const Config&) const override { fail_not_built("pass 'act_checkpoint'"); }
};

void register_components(Registry& registry) { registry.add(std::make_unique<ActCheckpointPass>()); }

}  // namespace
}  // namespace strata::act_checkpoint

STRATA_PLUGIN("act_checkpoint", "0.1.0", strata::act_checkpoint::register_components)
