// Data parallel: replicated parameters, gradients all-reduced in buckets during backward.
#include "strata/not_built.h"
#include "strata/plugin.h"

namespace strata::ddp {
namespace {

class DdpPass final : public Pass {
 public:
  DdpPass()
      : Pass({ComponentKind::Pass, "ddp", "Data parallel with bucketed all-reduce overlapped with backward",
              Schema()
                  .real("bucket_mb", 25.0, "Gradient bucket size in MiB", at_least(0.001))
                  .string("unused_parameters", "error", "Parameters that get no gradient: report them or skip them",
                          {"error", "ignore"})
                  .boolean("broadcast_buffers", true, "Broadcast buffers from rank 0 at start")},
             {Phase::Wrapping, {}, {"zero1", "zero2", "fsdp"}, {}, {}}) {}

  void apply(Job&, const Config&) const override { fail_not_built("pass 'ddp'"); }
};

void register_components(Registry& registry) { registry.add(std::make_unique<DdpPass>()); }

}  // namespace
}  // namespace strata::ddp

STRATA_PLUGIN("ddp", "0.1.0", strata::ddp::register_components)
