// ZeRO stages 1 and 2: optimizer states (and gradients) sharded across the data-parallel group.
#include "strata/not_built.h"
#include "strata/plugin.h"

namespace strata::zero {
namespace {

class ZeroPass final : public Pass {
 public:
  ZeroPass(int stage, std::string summary)
      : Pass({ComponentKind::Pass, "zero" + std::to_string(stage), std::move(summary),
              Schema().real("bucket_mb", 25.0, "Communication bucket size in MiB", at_least(0.001))},
             {Phase::Wrapping, {}, conflicts(stage), {}, {}}) {}

  void apply(Job&, const Config&) const override { fail_not_built("pass '" + name() + "'"); }

 private:
  static StringList conflicts(int stage) {
    return stage == 1 ? StringList{"ddp", "zero2", "fsdp"} : StringList{"ddp", "zero1", "fsdp"};
  }
};

void register_components(Registry& registry) {
  registry.add(std::make_unique<ZeroPass>(1, "ZeRO-1: optimizer states sharded, parameters all-gathered after the step"));
  registry.add(std::make_unique<ZeroPass>(2, "ZeRO-2: gradients reduce-scattered during backward, optimizer states sharded"));
}

}  // namespace
}  // namespace strata::zero

STRATA_PLUGIN("zero", "0.1.0", strata::zero::register_components)
