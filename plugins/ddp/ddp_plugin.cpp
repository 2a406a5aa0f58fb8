// Data parallel: parameters broadcast from rank 0, then gradients averaged over the
// data-parallel group in buckets (the flat units zero uses too), each launched asynchronously as
// soon as all of its gradients are final during the step's last backward, so communication
// overlaps computation. Parameters and the optimizer stay whole; after the reduction each
// parameter's gradient is a view of its bucket's averaged buffer. Buckets travel in amp's
// reduce_dtype when one is set. Experts split by expert_parallel (placed over Dim::Expert) are
// replicated only over the data ranks that hold the same experts: they are broadcast and averaged
// over that group (Topology::expert_data_group) in buckets of their own.
#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>

#include "../sharding/bucketing.h"
#include "../sharding/expert_split.h"
#include "strata/plugin.h"

namespace strata::ddp {
namespace {

class DdpPass final : public Pass {
 public:
  DdpPass()
      : Pass({ComponentKind::Pass, "ddp", "Data parallel with bucketed all-reduce overlapped with backward",
              sharding::add_unused_parameters_key(
                  Schema()
                      .real("bucket_mb", 25.0, "Gradient bucket size in MiB", at_least(0.001))
                      .boolean("broadcast_buffers", true, "Broadcast buffers from rank 0 at start"))},
             {Phase::Wrapping, {}, {"zero1", "zero2", "fsdp"}, {}, {}},
             {{Dim::Data}, {{Stage::SyncGradients, StageUse::Own}}}) {}

  // A ring all-reduce of every gradient, once per step: 2(d-1)/d of their bytes sent per rank,
  // the split experts' over their expert-data group of d/P ranks instead.
  void estimate(const Config& config, const PlanFacts& facts, CostEstimate& c) const override {
    c.comm_bytes += 2 * sharding::data_ring_share(sharding::expert_split(facts, c), static_cast<double>(c.data)) * c.gradient_bytes;
    c.messages += std::ceil(c.gradient_bytes / (config.get_float("bucket_mb") * (1 << 20)));  // one per bucket
  }

  void apply(Job& job, const Config& config) const override {
    sharding::Units units = sharding::make_data_parallel_buckets(*job.model, job.topology->group(Dim::Data), job.topology->expert_data_group(),
                                                                 config.get_float("bucket_mb"), sharding::GradReduce::AllReduce,
                                                                 job.reduce_dtype, config.get_bool("broadcast_buffers"));
    auto reducer = std::make_shared<sharding::BucketReducer>("ddp", units, sharding::ignores_unused_parameters(config));
    sharding::on_gradient_accumulated(units, [reducer](size_t unit, size_t param) { reducer->gradient_ready(unit, param); });
    sharding::release_gradients_before_each_step(job, units);
    // WSAM's local gradient (sync_gradients false) is left alone.
    job.add_hook(HookPoint::BeforeBackward, [reducer](StepContext& c) { reducer->begin_micro_batch(c.sync_gradients, c.last_backward); });
    job.program.own(Stage::SyncGradients, [reducer](StepContext& c) {
      if (!c.sync_gradients) return;
      c.metrics.emplace_back("ddp_exposed_comm_ms", reducer->finish());
      c.metrics.emplace_back("ddp_sent_bytes", reducer->take_reduced().sent);
    });
  }
};

void register_components(Registry& registry) { registry.add(std::make_unique<DdpPass>()); }

}  // namespace
}  // namespace strata::ddp

STRATA_PLUGIN("ddp", "0.3.0", strata::ddp::register_components)
