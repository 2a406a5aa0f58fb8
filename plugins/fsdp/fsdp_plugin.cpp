// Fully sharded data parallel (ZeRO-3) with ATorch's wrapping options.
#include "strata/not_built.h"
#include "strata/plugin.h"

namespace strata::fsdp {
namespace {

class FsdpPass final : public Pass {
 public:
  FsdpPass()
      : Pass({ComponentKind::Pass, "fsdp", "Parameters, gradients and optimizer states sharded per wrapped unit",
              Schema()
                  .strings("wrap", {"block"}, "Block types or names that become sharded units")
                  .integer("min_params", 0, "Size-based wrapping: smallest unit in parameters; 0 = wrap by name only", at_least(0))
                  .strings("ignored", {}, "Block names left unsharded")
                  .boolean("reshard_after_forward", true, "Free full parameters after a unit's forward")
                  .boolean("forward_prefetch", false, "All-gather the next unit during the current forward")
                  .integer("limit_all_gathers", 2, "Most all-gathers in flight at once", at_least(1))
                  .boolean("sync_module_states", true, "Broadcast initial parameters from rank 0")},
             {Phase::Wrapping, {}, {"ddp", "zero1", "zero2"}, {}, {}}) {}

  void validate(const Config& config, const SourcePos& section, Diagnostics& diagnostics) const override {
    if (config.get_strings("wrap").empty() && config.get_int("min_params") == 0)
      diagnostics.error(section, "pass 'fsdp' needs blocks to wrap: set wrap or min_params");
  }

  void apply(Job&, const Config&) const override { fail_not_built("pass 'fsdp'"); }
};

void register_components(Registry& registry) { registry.add(std::make_unique<FsdpPass>()); }

}  // namespace
}  // namespace strata::fsdp

STRATA_PLUGIN("fsdp", "0.1.0", strata::fsdp::register_components)
