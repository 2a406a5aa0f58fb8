// ZeRO stages 1 and 2: parameters grouped into buckets (flat units); in the last micro-batch's
// backward each bucket's gradients are reduced as soon as they are all final, overlapping
// backward. Each rank's optimizer updates only its chunk of every bucket, then the chunks are
// all-gathered. Stage 1 all-reduces (every rank keeps the averaged gradient); stage 2
// reduce-scatters (every rank keeps only its chunk of it). Gradients travel in amp's
// reduce_dtype when one is set. Experts split by expert_parallel are bucketed, reduced and
// sharded over the data ranks that hold the same experts (Topology::expert_data_group): their
// pieces are sharded over Dim::Expert (which experts) and Dim::Data (which chunk of them).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include <ATen/ATen.h>

#include "../sharding/bucketing.h"
#include "strata/plugin.h"

namespace strata::zero {
namespace {

using sharding::FlatUnit;
using sharding::Units;

class ZeroPass final : public Pass {
 public:
  ZeroPass(int stage, std::string summary)
      : Pass({ComponentKind::Pass, "zero" + std::to_string(stage), std::move(summary),
              sharding::add_unused_parameters_key(
                  Schema().real("bucket_mb", 25.0, "Bucket size in MiB: the unit of gradient reduction and of sharding", at_least(0.001)))},
             {Phase::Wrapping, {}, conflicts(stage), {}, {}}, {{Dim::Data}, {{Stage::SyncGradients, StageUse::Own}}}),
        stage_(stage) {}

  // The ZeRO paper's model states: stage 1 shards the optimizer state (8 + 8/d bytes per fp32
  // parameter with AdamW), stage 2 the gradients too (4 + 12/d). Gradients are all-reduced
  // (stage 1) or reduce-scattered (stage 2), then the updated chunks all-gathered.
  void estimate(const Config& config, const PlanFacts&, CostEstimate& c) const override {
    const double d = static_cast<double>(c.data);
    c.messages += 2 * std::ceil(c.gradient_bytes / (config.get_float("bucket_mb") * (1 << 20)));  // reduce, then gather, per bucket
    c.comm_bytes += (stage_ == 1 ? 2 : 1) * (d - 1) / d * c.gradient_bytes + (d - 1) / d * c.weight_bytes;
    c.optimizer_bytes /= d;
    // ZeRO-2 keeps a shard of the gradients, but each bucket's full gradient is staged for its
    // reduce-scatter and the stages of all buckets are alive when backward ends.
    if (stage_ == 2) c.transient_bytes = std::max(c.transient_bytes, c.gradient_bytes), c.gradient_bytes /= d;
  }

  void apply(Job& job, const Config& config) const override {
    Units units = sharding::make_data_parallel_buckets(*job.model, job.topology->group(Dim::Data), job.topology->expert_data_group(),
                                                       config.get_float("bucket_mb"),
                                                       stage_ == 1 ? sharding::GradReduce::AllReduce : sharding::GradReduce::ReduceScatter,
                                                       job.reduce_dtype, /*broadcast_buffers=*/true);
    auto reducer = std::make_shared<sharding::BucketReducer>(name(), units, sharding::ignores_unused_parameters(config));
    sharding::on_gradient_accumulated(units, [reducer](size_t unit, size_t param) { reducer->gradient_ready(unit, param); });
    // A backward left unsynchronised (WSAM's local pass, sync_gradients false) is left alone, as
    // ddp leaves it: nothing is reduced into the pieces, so until the next synchronised one the
    // gradients this rank holds are the parameters' own (amp unscales them, context parallel
    // averages them).
    auto synchronised = std::make_shared<bool>(true);
    job.add_hook(HookPoint::BeforeBackward, [reducer, synchronised](StepContext& c) {
      if (c.last_backward) *synchronised = c.sync_gradients;
      reducer->begin_micro_batch(c.sync_gradients && c.last_backward);
    });
    job.program.own(Stage::SyncGradients, [reducer](StepContext& c) {
      if (c.sync_gradients) c.metrics.emplace_back("zero_exposed_comm_ms", reducer->finish());
    });
    const auto own_gradients = job.local_gradients;  // core's: every parameter's
    sharding::shard_training_state(job, units);
    job.local_gradients = [own_gradients, pieces = job.local_gradients, synchronised] { return *synchronised ? pieces() : own_gradients(); };
  }

 private:
  static StringList conflicts(int stage) {
    return stage == 1 ? StringList{"ddp", "zero2", "fsdp"} : StringList{"ddp", "zero1", "fsdp"};
  }
  int stage_;
};

void register_components(Registry& registry) {
  registry.add(std::make_unique<ZeroPass>(1, "ZeRO-1: optimizer states sharded, parameters all-gathered after the step"));
  registry.add(std::make_unique<ZeroPass>(2, "ZeRO-2: gradients reduce-scattered during backward, optimizer states sharded"));
}

}  // namespace
}  // namespace strata::zero

STRATA_PLUGIN("zero", "0.2.0", strata::zero::register_components)
