// ZeRO stages 1 and 2: parameters grouped into buckets (flat units); in the last micro-batch's
// backward each bucket's gradients are reduced as soon as they are all final, overlapping
// backward. Each rank's optimizer updates only its chunk of every bucket, then the chunks are
// all-gathered. Stage 1 all-reduces (every rank keeps the averaged gradient); stage 2
// reduce-scatters (every rank keeps only its chunk of it) with at most two buckets' reductions
// in flight, so backward holds a few buckets of full gradient, not the model's; with
// reduce_every_micro_batch, every micro-batch reduce-scatters its share (gradient_accumulation.h)
// and full gradients are not held between micro-batches either (DeepSpeed's stage 2). Gradients travel in amp's
// reduce_dtype when one is set. Experts split by expert_parallel are bucketed, reduced and
// sharded over the data ranks that hold the same experts (Topology::expert_data_group): their
// pieces are sharded over Dim::Expert (which experts) and Dim::Data (which chunk of them).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <utility>

#include <ATen/ATen.h>

#include "../sharding/bucketing.h"
#include "../sharding/expert_split.h"
#include "../sharding/gradient_accumulation.h"
#include "strata/plugin.h"

namespace strata::zero {
namespace {

using sharding::FlatUnit;
using sharding::Units;

class ZeroPass final : public Pass {
 public:
  ZeroPass(int stage, std::string summary)
      : Pass({ComponentKind::Pass, "zero" + std::to_string(stage), std::move(summary), schema(stage)},
             {Phase::Wrapping, {}, conflicts(stage), {}, {}}, {{Dim::Data}, {{Stage::SyncGradients, StageUse::Own}}}),
        stage_(stage) {}

  // The ZeRO paper's model states: stage 1 shards the optimizer state (8 + 8/d bytes per fp32
  // parameter with AdamW), stage 2 the gradients too (4 + 12/d). Gradients are all-reduced
  // (stage 1) or reduce-scattered (stage 2), then the updated chunks all-gathered.
  void estimate(const Config& config, const PlanFacts& facts, CostEstimate& c) const override {
    const sharding::ExpertSplit split = sharding::expert_split(facts, c);
    const double d = static_cast<double>(c.data), experts = split.fraction();
    const double expert_data = d / static_cast<double>(facts.mesh.expert);
    // A ring collective over the data ranks sends (d-1)/d of the bytes; the split experts' goes
    // over their expert-data group, which also shards their states.
    const double sent = sharding::data_ring_share(split, d);
    const double kept = (1 - experts) / d + experts / expert_data;
    c.messages += 2 * std::ceil(c.gradient_bytes / (config.get_float("bucket_mb") * (1 << 20)));  // reduce, then gather, per bucket
    c.comm_bytes += ((stage_ == 1 ? 2 : 1) * c.gradient_bytes + c.weight_bytes) * sent;
    c.optimizer_bytes *= kept;
    // ZeRO-2 keeps a shard of the gradients; backward stages a few buckets' full gradients for
    // their reduce-scatters (the window of reductions in flight and the bucket filling), or,
    // accumulating several micro-batches whole, every full gradient until the last backward.
    if (stage_ == 2) {
      const bool every = config.get_bool("reduce_every_micro_batch");
      const double buckets = (sharding::ReductionWindow::kDefaultLimit + 1) * config.get_float("bucket_mb") * (1 << 20);
      const double staged = c.micro_batches > 1 && !every ? c.gradient_bytes : std::min(c.gradient_bytes, buckets);
      if (every) {
        c.comm_bytes += static_cast<double>(c.micro_batches - 1) * sent * c.gradient_bytes;
        c.messages += static_cast<double>(c.micro_batches - 1) * std::ceil(c.gradient_bytes / (config.get_float("bucket_mb") * (1 << 20)));
      }
      c.transient_bytes = std::max(c.transient_bytes, staged), c.gradient_bytes *= kept;
    }
  }

  std::string describe_plan(const Config& config, const PlanFacts& facts) const override {
    if (stage_ != 2) return {};
    return sharding::describe_accumulation(name(), "bucket", config.get_bool("reduce_every_micro_batch"), facts.mesh.micro_batches);
  }

  void apply(Job& job, const Config& config) const override {
    Units units = sharding::make_data_parallel_buckets(*job.model, job.topology->group(Dim::Data), job.topology->expert_data_group(),
                                                       config.get_float("bucket_mb"),
                                                       stage_ == 1 ? sharding::GradReduce::AllReduce : sharding::GradReduce::ReduceScatter,
                                                       job.reduce_dtype, /*broadcast_buffers=*/true);
    // Split experts' buckets: whether they complete in a micro-batch depends on the routing.
    const auto split_expert = sharding::split_expert_predicate(*job.model);
    Units routed;
    for (const auto& unit : units)
      if (split_expert(unit->params().front().first)) routed.push_back(unit);
    auto reducer = std::make_shared<sharding::BucketReducer>(name(), units, sharding::ignores_unused_parameters(config),
                                                             stage_ == 2 && config.get_bool("reduce_every_micro_batch"), routed);
    sharding::on_gradient_accumulated(units, [reducer](size_t unit, size_t param) { reducer->gradient_ready(unit, param); });
    sharding::release_gradients_before_each_step(job, units);
    // A backward left unsynchronised (WSAM's local pass, sync_gradients false) is left alone, as
    // ddp leaves it: nothing is reduced into the pieces, so until the next synchronised one the
    // gradients this rank holds are the parameters' own (amp unscales them, context parallel
    // averages them).
    auto synchronised = std::make_shared<bool>(true);
    job.add_hook(HookPoint::BeforeBackward, [reducer, synchronised](StepContext& c) {
      if (c.last_backward) *synchronised = c.sync_gradients;
      reducer->begin_micro_batch(c.sync_gradients, c.last_backward);
    });
    auto reduced = std::make_shared<sharding::Traffic>();
    job.program.own(Stage::SyncGradients, [reducer, reduced](StepContext& c) {
      if (!c.sync_gradients) return;
      c.metrics.emplace_back("zero_exposed_comm_ms", reducer->finish());
      *reduced = reducer->take_reduced();
      c.metrics.emplace_back("zero_reduce_bytes", static_cast<double>(reduced->full));
    });
    const auto own_gradients = job.local_gradients;  // core's: every parameter's
    const std::shared_ptr<sharding::Traffic> gathered = sharding::shard_training_state(job, units);
    // The updated chunks' all-gather runs in the optimizer step, after sync_gradients reported.
    job.add_hook(HookPoint::AfterStep, [gathered, reduced](StepContext& c) {
      const sharding::Traffic gather = std::exchange(*gathered, sharding::Traffic{}), reduce = std::exchange(*reduced, sharding::Traffic{});
      c.metrics.emplace_back("zero_gather_bytes", static_cast<double>(gather.full));
      c.metrics.emplace_back("zero_sent_bytes", gather.sent + reduce.sent);
    });
    job.local_gradients = [own_gradients, pieces = job.local_gradients, synchronised] { return *synchronised ? pieces() : own_gradients(); };
  }

 private:
  static Schema schema(int stage) {
    Schema schema = sharding::add_unused_parameters_key(
        Schema().real("bucket_mb", 25.0, "Bucket size in MiB: the unit of gradient reduction and of sharding", at_least(0.001)));
    if (stage == 2)
      schema.boolean("reduce_every_micro_batch", false,
                     "Reduce-scatter each micro-batch's gradients as each bucket completes (DeepSpeed's stage 2), so no full gradient "
                     "is held between micro-batches; false: accumulate full gradients over the step and reduce once (less "
                     "communication, full gradients held through the step)")
          .tuned({false, true});
    return schema;
  }
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
