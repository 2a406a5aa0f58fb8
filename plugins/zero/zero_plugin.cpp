// ZeRO stages 1 and 2: parameters grouped into buckets (flat units); in the last micro-batch's
// backward each bucket's gradients are reduced as soon as they are all final, overlapping
// backward. Each rank's optimizer updates only its chunk of every bucket, then the chunks are
// all-gathered. Stage 1 all-reduces (every rank keeps the averaged gradient); stage 2
// reduce-scatters (every rank keeps only its chunk of it). Gradients travel in amp's
// reduce_dtype when one is set.
#include <chrono>
#include <optional>

#include <ATen/ATen.h>

#include "../sharding/sharded_training.h"
#include "strata/plugin.h"

namespace strata::zero {
namespace {

using sharding::FlatUnit;
using sharding::Units;

// Buckets of at most `bucket_mb`, filled from the last parameter backwards (the order gradients
// arrive in), one dtype each.
Units make_buckets(nn::Model& model, Communicator& comm, double bucket_mb, sharding::GradReduce reduce,
                   std::optional<at::ScalarType> reduce_dtype) {
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (const auto& p : model.named_parameters())
    if (p.value().requires_grad()) params.emplace_back(p.key(), p.value());
  const auto limit = static_cast<int64_t>(bucket_mb * 1024 * 1024);
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> groups;
  int64_t bytes = 0;
  for (size_t i = params.size(); i-- > 0;) {
    const at::Tensor& p = params[i].second;
    const auto size = static_cast<int64_t>(p.nbytes());
    if (groups.empty() || (bytes > 0 && bytes + size > limit) || groups.back().front().second.scalar_type() != p.scalar_type()) {
      groups.emplace_back();
      bytes = 0;
    }
    groups.back().push_back(params[i]);
    bytes += size;
  }
  Units units;
  for (auto& group : groups)
    units.push_back(std::make_shared<FlatUnit>("bucket" + std::to_string(units.size()), std::move(group), comm, reduce,
                                               /*persistent_params=*/true, sharding::UnitDtypes{std::nullopt, reduce_dtype}));
  return units;
}

// Reduces each bucket as soon as backward has finished all of its gradients.
class BucketReducer {
 public:
  BucketReducer(std::string pass, Units units, bool ignore_unused)
      : pass_(std::move(pass)), units_(std::move(units)), ignore_unused_(ignore_unused) {}

  void begin_micro_batch(bool last) {
    syncing_ = last;
    if (last)
      for (auto& unit : units_) unit->begin_backward();
  }

  void gradient_ready(size_t unit, size_t param) {
    if (syncing_ && units_[unit]->mark_ready(param)) units_[unit]->start_reduce();
  }

  // Returns the milliseconds spent waiting for communication that backward did not hide.
  double finish() {
    sharding::check_unused_parameters(pass_, ignore_unused_, units_);
    for (auto& unit : units_)
      if (!unit->complete()) {
        unit->fill_missing_gradients();
        unit->start_reduce();
      }
    const auto waiting = std::chrono::steady_clock::now();
    for (auto& unit : units_) unit->wait_reduced();
    syncing_ = false;
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - waiting).count();
  }

 private:
  std::string pass_;
  Units units_;
  bool ignore_unused_;
  bool syncing_ = false;
};

class ZeroPass final : public Pass {
 public:
  ZeroPass(int stage, std::string summary)
      : Pass({ComponentKind::Pass, "zero" + std::to_string(stage), std::move(summary),
              sharding::add_unused_parameters_key(
                  Schema().real("bucket_mb", 25.0, "Bucket size in MiB: the unit of gradient reduction and of sharding", at_least(0.001)))},
             {Phase::Wrapping, {}, conflicts(stage), {}, {}}, {{Dim::Data}, {{Stage::SyncGradients, StageUse::Own}}}),
        stage_(stage) {}

  void apply(Job& job, const Config& config) const override {
    Communicator& comm = job.topology->group(Dim::Data);
    sharding::broadcast_model_state(*job.model, comm);
    Units units = make_buckets(*job.model, comm, config.get_float("bucket_mb"),
                               stage_ == 1 ? sharding::GradReduce::AllReduce : sharding::GradReduce::ReduceScatter,
                               job.reduce_dtype);
    auto reducer = std::make_shared<BucketReducer>(name(), units, sharding::ignores_unused_parameters(config));
    sharding::on_gradient_accumulated(units, [reducer](size_t unit, size_t param) { reducer->gradient_ready(unit, param); });
    job.add_hook(HookPoint::BeforeBackward, [reducer](StepContext& c) { reducer->begin_micro_batch(c.last_backward); });
    job.program.own(Stage::SyncGradients, [reducer](StepContext& c) { c.metrics.emplace_back("zero_exposed_comm_ms", reducer->finish()); });
    sharding::shard_training_state(job, units);
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
