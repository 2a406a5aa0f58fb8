// Fully sharded data parallel (ZeRO-3) with ATorch's wrapping options. Each wrapped unit (a
// run of blocks) keeps only this rank's chunk of its parameters; the full parameters are
// all-gathered before the unit's forward and again before its backward, freed after each, and
// its gradients are reduce-scattered once its backward is done. Parameters of no unit form the
// root unit, gathered for the whole forward and backward; ignored blocks keep full parameters
// and are reduced like zero1. Under amp, full parameters are gathered in the compute dtype (the
// fp32 shards stay the optimizer's master weights) and gradients reduced in amp's reduce_dtype.
// Experts split by expert_parallel are replicated only over the data ranks holding the same
// experts: each unit's split-expert parameters form a companion unit sharded over that group
// (Topology::expert_data_group), gathered, freed and reduced together with it; sharded
// initialisation keeps its chunks of both as the model is built (fsdp_sharded_init.h).
// With shard_size = S the data ranks form shard groups of S that each shard the model as above
// and replicate it across groups (HSDP, fsdp_hybrid.h); split experts shard over the ranks of
// the shard group holding the same experts and replicate across the same groups (or, when the
// expert groups span several shard groups, stay whole and average over the expert-data group).
// Gradient accumulation holds each parameter's full gradient until the step's last backward
// reduces it, or, with reduce_every_micro_batch, reduce-scatters each micro-batch's share as the
// unit's backward completes and sums the shares in the gradient chunk (more communication, no
// full gradient held between micro-batches: what lets a large model accumulate).
// A backward left unsynchronised (WSAM's local pass) is reduced nowhere: each parameter keeps
// its own full gradient. A change of the full parameters the shards do not carry (WSAM's local
// perturbation, Job::offset_full_parameters) is added to every gather until it is cleared.
#include <algorithm>
#include <chrono>
#include <optional>

#include <ATen/ATen.h>

#include "../common/block_selectors.h"
#include "../sharding/expert_split.h"
#include "../sharding/gradient_accumulation.h"
#include "../sharding/reduction_window.h"
#include "../sharding/sharded_training.h"
#include "fsdp_hybrid.h"
#include "fsdp_sharded_init.h"
#include "fsdp_units.h"
#include "strata/plugin.h"

namespace strata::fsdp {
namespace {

// Why sharded initialisation cannot serve this job (the model is built whole, then sharded), or
// empty.
std::string whole_build_reason(const Config& config, int64_t shard_ranks) {
  if (!config.get_bool("sharded_init")) return "sharded_init = false";
  // One rank keeps every chunk: a keeper would only add the block being drawn to the whole model.
  if (shard_ranks == 1) return "one rank per shard group: nothing to shard";
  return {};
}

using sharding::FlatUnit;
using sharding::GradReduce;
using sharding::Units;
using NamedParams = std::vector<std::pair<std::string, at::Tensor>>;

struct Options {
  bool ignore_unused;
  bool reshard_after_forward;
  bool forward_prefetch;
  int64_t limit_all_gathers;
  bool reduce_every_micro_batch;
};

NamedParams block_params(const nn::Model& model, size_t b) {
  NamedParams out;
  for (const auto& p : model.block(b).named_parameters())
    if (p.value().requires_grad()) out.emplace_back(model.block_name(b) + "." + p.key(), p.value());
  return out;
}

// The units gathered and freed together: a wrapped run's (or the root's) dense parameters over
// the data ranks and, under expert parallel, its split experts over the expert-data ranks.
using UnitSet = Units;

// Gathers and frees units around their uses and reduces their gradients.
//
// The wrapped run that ends the model (`ending`: it holds the head, on the last pipeline stage
// when pipelined) is held like the root: gathered from its first forward to the step's last
// backward, and in evaluation until the evaluation ends. The loss runs after the model's
// forward and its backward is the first to need those parameters again, so freeing them in
// between would only gather them back (FSDP2 and torchtitan leave the last block the same way);
// and under fused_loss the loss itself multiplies by the output projection's weight.
class Sharder {
 public:
  // `routed`: the units of split experts, whose gradients depend on the routing.
  Sharder(std::vector<UnitSet> wrapped, std::optional<size_t> ending, UnitSet root, UnitSet ignored, Units routed, Options options)
      : wrapped_(std::move(wrapped)), ending_(ending), root_(std::move(root)), routed_(std::move(routed)), options_(options) {
    for (auto& set : wrapped_) all_.insert(all_.end(), set.begin(), set.end());
    all_.insert(all_.end(), root_.begin(), root_.end());
    all_.insert(all_.end(), ignored.begin(), ignored.end());
  }
  const Units& all_units() const { return all_; }

  // Forward of wrapped run `u`: its parameters, and the next run's when prefetching.
  void before_unit(size_t u) {
    gather(wrapped_[u]);
    wait_gathered(wrapped_[u]);
    if (options_.forward_prefetch && u + 1 < wrapped_.size() && !wrapped_[u + 1].front()->gathered() &&
        in_flight() < options_.limit_all_gathers)
      gather(wrapped_[u + 1]);
  }

  void after_unit(size_t u, const at::Tensor& output) {
    if (u == ending_) return;  // held until the backward (or the evaluation) is done
    const UnitSet* set = &wrapped_[u];
    const bool backward_follows = at::GradMode::is_enabled() && output.requires_grad();
    // The gradient of the run's output arrives just before backward enters the run.
    if (backward_follows && options_.reshard_after_forward)
      output.register_hook([this, set](const at::Tensor&) {
        gather(*set);
        wait_gathered(*set);
      });
    if (!backward_follows || options_.reshard_after_forward)
      for (auto& unit : *set) unit->release();
  }

  void before_model() {
    gather(root_);
    wait_gathered(root_);
  }

  void after_model() {
    if (at::GradMode::is_enabled()) return;  // training keeps the root until its backward is done
    for (auto& unit : all_)
      if (!held(*unit)) unit->release();
  }

  // After an evaluation (the root and the ending run were held through each batch's loss) or an
  // unsynchronised backward: every unit let go, nothing reduced.
  void release_all() {
    for (auto& unit : all_) unit->release();
  }

  // Job::offset_full_parameters: every unit adds its parameters' offsets to its gathers.
  void set_full_offsets(const NamedTensors& offsets) {
    for (auto& unit : all_) unit->set_full_offsets(offsets);
  }

  // `synchronised`: the step's gradients are reduced (not WSAM's local pass); `last`: and this is
  // its last backward.
  void begin_micro_batch(bool synchronised, bool last) {
    synchronised_ = synchronised;
    last_ = last;
    for (auto& unit : all_) unit->begin_backward();
  }

  void gradient_ready(size_t unit, size_t param) {
    if (all_[unit]->mark_ready(param)) unit_backward_done(*all_[unit], /*complete=*/true);
  }

  // After each backward: units some parameters of which got no gradient finish here.
  void after_backward() {
    if (last_) sharding::check_unused_parameters("fsdp", options_.ignore_unused, all_);
    for (auto& unit : all_)
      if (!unit->complete()) {
        if (last_) unit->fill_missing_gradients();
        unit_backward_done(*unit, /*complete=*/last_);
      }
  }

  // sync_gradients, after the last backward: every reduction completes. Returns the milliseconds
  // spent waiting.
  double finish() {
    const auto waiting = std::chrono::steady_clock::now();
    // HSDP: every unit's average over the replicas is in flight before the first is waited for.
    for (auto& unit : all_) unit->start_replica_reduce();
    for (auto& unit : all_) unit->wait_reduced(), unit->release();
    return reductions_.finish() + std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - waiting).count();
  }

  // This step's collectives: how many all-gathers, the bytes of the full buffers gathered and
  // reduced, and (HSDP) of the gradient chunks averaged over the replicas.
  struct Traffic {
    int64_t all_gathers = 0, gather_bytes = 0, reduce_bytes = 0, replica_reduce_bytes = 0;
    double sent_bytes = 0;  // what this rank sent of them all (sharding::Traffic)
  };
  Traffic take_traffic() { return std::exchange(traffic_, Traffic{}); }

 private:
  void gather(const UnitSet& set) {
    for (const auto& unit : set) {
      if (unit->gathered()) continue;
      unit->start_gather();
      ++traffic_.all_gathers;
      traffic_.gather_bytes += unit->gather_bytes(), traffic_.sent_bytes += unit->gather_traffic().sent;
    }
  }
  static void wait_gathered(const UnitSet& set) {
    for (const auto& unit : set) unit->wait_gathered();
  }

  int64_t in_flight() const {
    int64_t n = 0;
    for (const auto& unit : all_) n += unit->gathering() ? 1 : 0;
    return n;
  }

  // Gradients are reduced in the last micro-batch; earlier ones accumulate locally or, with
  // reduce_every_micro_batch, reduce their share as each unit's backward completes, so a unit's
  // full gradient lives only through its backward. Full parameters are freed unless the next
  // micro-batch reuses them without resharding.
  // A share is reduced only where every data rank reduces it alike, which the schedule decides:
  // a unit complete in this backward (not one left incomplete, e.g. its weight gradients held
  // back by zero_bubble, which the next share or the last carries), of dense parameters (a split
  // expert's gradient depends on where tokens were routed) and reduce-scattered (the ignored
  // unit keeps whole, all-reduced gradients).
  void unit_backward_done(FlatUnit& unit, bool complete) {
    const bool routed = sharding::holds(routed_, unit);
    const bool share = !last_ && synchronised_ && options_.reduce_every_micro_batch && complete && unit.reduce_scatters() && !routed;
    if (last_ || share) {
      unit.start_reduce(/*final=*/last_), traffic_.reduce_bytes += unit.reduce_bytes(), traffic_.sent_bytes += unit.reduce_traffic(last_).sent;
      if (last_) traffic_.replica_reduce_bytes += unit.replica_reduce_bytes();
      reductions_.started(unit);  // at most two units' gradients in flight (reduction_window.h)
    }
    const bool keep = !last_ && (held(unit) || !options_.reshard_after_forward);
    if (!keep) unit.release();
  }

  // The root's units and the ending run's: gathered until the step's last backward.
  bool held(const FlatUnit& unit) const {
    return sharding::holds(root_, unit) || (ending_ && sharding::holds(wrapped_[*ending_], unit));
  }

  std::vector<UnitSet> wrapped_;
  std::optional<size_t> ending_;
  UnitSet root_;
  Units routed_;
  Units all_;
  Options options_;
  sharding::ReductionWindow reductions_;  // gradient reductions in flight during backward
  bool synchronised_ = true, last_ = true;
  Traffic traffic_;
};

// What a rank keeps of its split experts, for `strata plan`: " (of its experts, 1/n)", or whole.
std::string expert_share(int64_t expert_size, int64_t expert_ranks) {
  if (expert_size <= 1) return {};
  return expert_ranks == 1 ? " (its experts whole)" : " (of its experts, 1/" + std::to_string(expert_ranks) + ")";
}

class FsdpPass final : public Pass, public KeepsBuiltBlocks {
 public:
  FsdpPass()
      : Pass({ComponentKind::Pass, "fsdp", "Parameters, gradients and optimizer states sharded per wrapped unit",
              sharding::add_unused_parameters_key(Schema()
                  .strings("wrap", {"block"}, "Block types or names that become sharded units")
                  .integer("min_params", 0, "Size-based wrapping: smallest unit in parameters; 0 = wrap by name only", at_least(0))
                  .strings("ignored", {}, "Block types or names whose parameters stay whole (gradients all-reduced, optimizer state sharded)")
                  .boolean("reshard_after_forward", true, "Free full parameters after a unit's forward")
                  .tuned({true, false})
                  .boolean("forward_prefetch", false, "All-gather the next unit during the current forward")
                  .integer("limit_all_gathers", 2, "Most all-gathers in flight at once", at_least(1))
                  .boolean("reduce_every_micro_batch", false,
                           "Reduce-scatter each micro-batch's gradients as each unit's backward completes (FSDP2's default), so no full "
                           "gradient outlives its unit's backward; false: accumulate full gradients over the step and reduce once "
                           "(less communication, full gradients held through the step)")
                  .tuned({false, true})
                  .boolean("sync_module_states", true, "Broadcast initial parameters from rank 0")
                  .integer("shard_size", 0,
                           "Hybrid sharding (HSDP): shard over groups of this many contiguous data ranks, replicate across the groups; "
                           "0 = shard over every data rank",
                           at_least(0))
                  .boolean("sharded_init", true,
                           "Each rank keeps only its shards as the model is built (peak: shards plus one block), not the whole model"))},
             {Phase::Wrapping, {}, {"ddp", "zero1", "zero2"}, {}, {}}, {{Dim::Data}, {{Stage::SyncGradients, StageUse::Own}}}) {}

  void validate(const Config& config, const SourcePos& section, Diagnostics& diagnostics) const override {
    if (config.get_strings("wrap").empty() && config.get_int("min_params") == 0)
      diagnostics.error(section, "pass 'fsdp' needs blocks to wrap: set wrap or min_params");
  }

  std::string size_problem(const Config& config, const Config&, const MeshSizes& mesh) const override {
    const int64_t s = config.get_int("shard_size");
    if (s > 0 && mesh.data % s != 0)
      return "pass 'fsdp': shard_size = " + std::to_string(s) + " does not divide the " + std::to_string(mesh.data) + " data ranks";
    return {};
  }

  // Model states all sharded (16/d bytes per fp32 AdamW parameter) plus what is gathered at once:
  // the root unit (embeddings, head, final norm) and up to limit_all_gathers layers (every layer
  // without reshard_after_forward), with up to limit_all_gathers layers' gradients before the
  // reduce-scatter; with several micro-batches accumulated whole, the full
  // gradients as well. The root unit is gathered once a step and stays gathered; a layer unit
  // too without reshard_after_forward, and with it once for every micro-batch's forward and again
  // for its backward (measured at fsdp 2 on tests/cli/parity.toml, 2 layers: 3 all-gathers a
  // step without it at 1 or 4 micro-batches; with it 5 at 1 and 17 at 4). Gradients are
  // reduce-scattered once a step, or once per micro-batch with reduce_every_micro_batch.
  // Under HSDP (fsdp_hybrid.h) the same within a shard group of S, plus the gradient chunks'
  // all-reduce over the D/S replicas. Split experts (expert_parallel) go over their own shard
  // group, the shard group's ranks holding the same experts, and replicas, the rest of their
  // expert-data group; they lie in the layer units.
  void estimate(const Config& config, const PlanFacts& facts, CostEstimate& c) const override {
    const int64_t data = c.data, shard = effective_shard_size(config.get_int("shard_size"), data);
    const double d = static_cast<double>(shard), t = static_cast<double>(c.tensor);
    const double replicas = static_cast<double>(data) / d, m = static_cast<double>(c.micro_batches);
    const sharding::ExpertSplit split = sharding::expert_split(facts, c);
    const double experts = split.fraction();
    const double expert_shard = experts > 0 ? static_cast<double>(expert_shard_size(shard, data, facts.mesh.expert)) : 1;
    const double expert_replicas = static_cast<double>(data) / split.ranks / expert_shard;
    const bool reshard = config.get_bool("reshard_after_forward"), every = config.get_bool("reduce_every_micro_batch");
    const double layer_gathers = reshard ? 2 * m : 1, reductions = every ? m : 1;
    const double layer_fraction = c.model.parameters > 0 ? static_cast<double>(c.model.layers * c.model.layer_parameters) /
                                                               static_cast<double>(c.model.parameters)
                                                         : 1;
    // Of this rank's parameters: the root unit's, the layers' replicated ones, the split experts'.
    const double root_share = (1 - layer_fraction) / split.kept(), dense_layers = 1 - root_share - experts;
    using sharding::ring_share;
    const double weights = c.weight_bytes, gradients = c.gradient_bytes;
    c.comm_bytes += ring_share(d) * weights * (root_share + layer_gathers * dense_layers) +
                    ring_share(expert_shard) * weights * layer_gathers * experts +
                    reductions * (ring_share(d) * (1 - experts) + ring_share(expert_shard) * experts) * gradients +
                    2 * (ring_share(replicas) * (1 - experts) / d + ring_share(expert_replicas) * experts / expert_shard) * gradients;
    // Each all-gather and reduce-scatter is a message: the root's and every layer's of the stage.
    const double layers = static_cast<double>(c.model.layers) / static_cast<double>(c.pipeline);
    c.messages += 1 + layers * layer_gathers + (layers + 1) * reductions;
    // Accumulating over micro-batches without reduce_every_micro_batch holds every full gradient
    // from the step's first backward to its last, besides this rank's chunk.
    const double held_full_gradients = c.micro_batches > 1 && !every ? c.gradient_bytes : 0;
    const double kept = (1 - experts) / d + experts / expert_shard;
    c.weight_bytes *= kept, c.gradient_bytes = c.gradient_bytes * kept + held_full_gradients, c.optimizer_bytes *= kept;
    // Gathered at once: the root and, with reshard_after_forward, up to limit_all_gathers layers;
    // without it every layer of the stage, from its forward to its backward. Measured with the
    // counting allocator's peak (mem_device_peak_bytes), 16 layers of d_model 512 at fsdp 2:
    // 578.8 MB with it, 759.5 MB without, where this adds 14 gathered layers' 176 MB.
    const double layer = static_cast<double>(c.model.layer_parameters), in_flight = static_cast<double>(config.get_int("limit_all_gathers"));
    const double root = static_cast<double>(c.model.parameters) - static_cast<double>(c.model.layers) * layer;
    const double gathered_layers = reshard ? in_flight : std::max(layers, in_flight);
    c.transient_bytes += 4 * (root + gathered_layers * layer) / t + 4 * (root + in_flight * layer) / t;
  }

  // Sharded initialisation (fsdp_sharded_init.h) where this rank's units can be planned on the
  // outline; otherwise the model is built whole and sharded in apply(), as `strata plan` says.
  // Under a pipeline the outline is already cut to this rank's stage (KeepsBuiltBlocks), the
  // blocks apply() will shard once pipeline_parallel has applied.
  std::shared_ptr<nn::BuildKeeper> keeper_of_built_blocks(const Config& config, const Job& job,
                                                          const std::function<const nn::Model&()>& outline) const override {
    const int64_t shard_ranks = effective_shard_size(config.get_int("shard_size"), job.topology->size(Dim::Data));
    if (!whole_build_reason(config, shard_ranks).empty()) return nullptr;
    // This rank's chunk is its position in its shard group (fsdp_hybrid.h); a split expert's, its
    // position among the shard group's ranks holding the same experts. The outline was built with
    // this rank's experts only, so their shapes are the ones apply() shards.
    const nn::Model& model = outline();
    const int64_t expert_ranks = expert_shard_size(shard_ranks, job.topology->size(Dim::Data), job.topology->size(Dim::Expert));
    return std::make_shared<ShardKeeper>(unit_layouts(plan_units(model, config), sharding::split_expert_predicate(model)),
                                         ChunkGroup{shard_ranks, job.topology->rank_in(Dim::Data) % shard_ranks},
                                         ChunkGroup{expert_ranks, job.topology->expert_data_group().rank() % expert_ranks},
                                         /*hybrid=*/shard_ranks < job.topology->size(Dim::Data));
  }

  std::string describe_plan(const Config& config, const PlanFacts& facts) const override {
    const bool experts = std::find(facts.enabled_passes.begin(), facts.enabled_passes.end(), "expert_parallel") != facts.enabled_passes.end();
    const int64_t shard_ranks = effective_shard_size(config.get_int("shard_size"), facts.mesh.data);
    const std::string hybrid =
        shard_ranks < facts.mesh.data
            ? "fsdp: hybrid sharding (HSDP): " + std::to_string(facts.mesh.data / shard_ranks) + " shard groups of " +
                  std::to_string(shard_ranks) + " data ranks, each holding 1/" + std::to_string(shard_ranks) +
                  " of the model states, replicated across the groups; " + describe_groups(shard_ranks, facts.mesh.data) + "\n"
            : std::string();
    const std::string why = whole_build_reason(config, shard_ranks);
    const std::string build =
        why.empty() ? "fsdp: sharded initialisation: each rank keeps 1/" + std::to_string(shard_ranks) + " of every unit" +
                          (facts.mesh.pipeline > 1 ? " of its pipeline stage" : "") +
                          expert_share(experts ? facts.mesh.expert : 1, expert_shard_size(shard_ranks, facts.mesh.data, facts.mesh.expert)) +
                          " as the model is built"
                    : "fsdp: every rank builds the whole model, then keeps its shards (" + why + ")";
    const std::string accumulation =
        sharding::describe_accumulation("fsdp", "unit", config.get_bool("reduce_every_micro_batch"), facts.mesh.micro_batches);
    return hybrid + build + (accumulation.empty() ? "" : "\n" + accumulation);
  }


  void apply(Job& job, const Config& config) const override {
    nn::Model& model = *job.model;
    // An entry of wrap or ignored naming no block on any rank is a typo: refused.
    for (const char* key : {"wrap", "ignored"}) block_selectors::refuse_unmatched(job, "fsdp", key, config.get_strings(key));
    Communicator& data_comm = job.topology->group(Dim::Data);
    Communicator& expert_comm = job.topology->expert_data_group();
    // HSDP: units shard over this rank's shard group and average gradients over its replica group
    // (split from the data group: collective, every data rank in step).
    const int64_t data = data_comm.size(), shard_ranks = effective_shard_size(config.get_int("shard_size"), data);
    std::shared_ptr<Communicator> shard_comm, replica_comm;
    if (shard_ranks < data) {
      shard_comm = data_comm.split(shard_group(shard_ranks, data, data_comm.rank()));
      replica_comm = data_comm.split(replica_group(shard_ranks, data, data_comm.rank()));
    }
    Communicator& comm = shard_comm ? *shard_comm : data_comm;
    // Split experts likewise: sharded within the shard group over the ranks holding the same
    // experts and replicated over the same replica group when E divides S; otherwise kept whole and
    // averaged over the expert-data group (fsdp_hybrid.h: experts_whole).
    const int64_t expert_size = job.topology->size(Dim::Expert);
    std::shared_ptr<Communicator> expert_shard_comm;
    if (shard_comm && expert_size > 1)
      expert_shard_comm = expert_comm.split(expert_shard_group(shard_ranks, data, expert_size, expert_comm.rank()));
    Communicator& experts_over = !shard_comm ? expert_comm : expert_shard_comm ? *expert_shard_comm : comm;
    // Whole experts are averaged over the whole expert-data group; sharded ones over the dense
    // units' replica group.
    const int64_t expert_pieces = expert_pieces_group(shard_ranks, data, expert_size);
    Communicator* expert_replicas =
        replica_comm && expert_size > 1 && experts_whole(shard_ranks, data, expert_size) ? &expert_comm : replica_comm.get();
    auto* keeper = dynamic_cast<ShardKeeper*>(job.build_keeper.get());
    if (config.get_bool("sync_module_states")) {
      // After a sharded build the ranks drew the same values from the same generators: what they
      // kept is already equal, only what was built whole (buffers, frozen or ignored parameters)
      // is sent; the placeholders are skipped.
      sharding::broadcast_model_state(model, data_comm, expert_comm);
    }
    const auto split_expert = sharding::split_expert_predicate(model);
    const UnitPlan plan = plan_units(model, config);
    if (plan.runs.empty())
      throw UserError("pass 'fsdp': no block of the model is wrapped (wrap = [" + block_selectors::quoted_list(config.get_strings("wrap")) + "]" +
                      ", min_params = " + std::to_string(config.get_int("min_params")) + ")");
    std::map<std::string, at::Tensor> by_name;
    for (size_t b = 0; b < model.num_blocks(); ++b)
      for (auto& np : block_params(model, b)) by_name[np.first] = np.second;
    auto named = [&](const std::vector<std::string>& names) {
      NamedParams out;
      for (const auto& n : names) out.emplace_back(n, by_name.at(n));
      return out;
    };
    const std::vector<UnitLayout> layouts = keeper ? unit_layouts(plan, split_expert) : std::vector<UnitLayout>{};
    if (keeper) keeper->restore_changed_units(layouts, by_name, comm, experts_over, job.device());

    // Wrapped and root units gather in the compute dtype; the ignored unit keeps its parameters
    // whole, in their own dtype. Each becomes a set: its dense parameters over the data ranks, its
    // split experts (if any) over the expert-data ranks.
    const sharding::UnitDtypes gathered{job.gather_dtype, job.reduce_dtype}, whole{std::nullopt, job.reduce_dtype};
    Units routed;  // split experts' units
    auto unit_set = [&](const std::string& name, NamedParams params, GradReduce reduce, bool persistent, sharding::UnitDtypes dtypes) {
      NamedParams dense, experts;
      for (auto& np : params) (split_expert(np.first) ? experts : dense).push_back(std::move(np));
      // A unit kept at build starts from its chunk, any other from its whole parameters.
      auto flat_unit = [&](const std::string& unit, NamedParams params, Communicator& over) {
        const auto layout = std::find_if(layouts.begin(), layouts.end(), [&](const UnitLayout& u) { return u.name == unit; });
        if (keeper && !persistent && layout != layouts.end() && keeper->planned(*layout)) {
          const at::Tensor chunk = keeper->take_chunk(*layout).to(job.device(), params.front().second.scalar_type());
          return std::make_shared<FlatUnit>(unit, std::move(params), over, chunk, dtypes);
        }
        return std::make_shared<FlatUnit>(unit, std::move(params), over, reduce, persistent, dtypes);
      };
      UnitSet set;
      if (!dense.empty()) {
        set.push_back(flat_unit(name, std::move(dense), comm));
        if (replica_comm) set.back()->replicate_across(*replica_comm, shard_ranks);
      }
      if (!experts.empty()) {
        set.push_back(flat_unit(name + ".experts", std::move(experts), experts_over));
        routed.push_back(set.back());
        if (expert_replicas) set.back()->replicate_across(*expert_replicas, expert_pieces);
      }
      return set;
    };
    std::vector<UnitSet> wrapped;
    std::vector<size_t> wrapped_run;  // the run each wrapped set shards
    for (size_t r = 0; r < plan.runs.size(); ++r) {
      if (plan.run_params[r].empty()) continue;  // nothing to shard; its blocks run as they are
      wrapped.push_back(unit_set(model.block_name(plan.runs[r].first), named(plan.run_params[r]), GradReduce::ReduceScatter, false, gathered));
      wrapped_run.push_back(r);
    }
    UnitSet root = unit_set("root", named(plan.root), GradReduce::ReduceScatter, false, gathered);
    UnitSet ignored = unit_set("ignored", named(plan.ignored), GradReduce::AllReduce, true, whole);
    job.build_keeper.reset();
    const Options options{sharding::ignores_unused_parameters(config), config.get_bool("reshard_after_forward"), config.get_bool("forward_prefetch"),
                          config.get_int("limit_all_gathers"), config.get_bool("reduce_every_micro_batch")};
    // The run ending the model: its last block is the model's head (on the last stage, where
    // pipeline_parallel kept only this rank's blocks).
    std::optional<size_t> ending;
    const bool holds_head = job.topology->rank_in(Dim::Pipeline) == job.topology->size(Dim::Pipeline) - 1;
    if (!wrapped_run.empty() && holds_head && plan.runs[wrapped_run.back()].last + 1 == model.num_blocks()) ending = wrapped_run.size() - 1;
    auto sharder = std::make_shared<Sharder>(wrapped, ending, root, ignored, routed, options);

    for (size_t u = 0; u < wrapped_run.size(); ++u) {
      const BlockRun& run = plan.runs[wrapped_run[u]];
      model.add_pre_forward_hook(run.first, [sharder, u](nn::Block&, const at::Tensor&) { sharder->before_unit(u); });
      model.add_post_forward_hook(run.last, [sharder, u](nn::Block&, const at::Tensor& out) { sharder->after_unit(u, out); });
    }
    model.add_pre_forward_hook(0, [sharder](nn::Block&, const at::Tensor&) { sharder->before_model(); });
    model.add_post_forward_hook(model.num_blocks() - 1, [sharder](nn::Block&, const at::Tensor&) { sharder->after_model(); });

    sharding::on_gradient_accumulated(sharder->all_units(), [sharder](size_t unit, size_t param) { sharder->gradient_ready(unit, param); });
    sharding::release_gradients_before_each_step(job, sharder->all_units());
    // A backward left unsynchronised (WSAM's local pass, sync_gradients false) is reduced nowhere,
    // as under ddp and zero: each parameter keeps its own full gradient, which until the next
    // synchronised backward is what this rank holds (amp unscales it, context parallel averages
    // it), and the sync stage lets the units go.
    auto synchronised = std::make_shared<bool>(true);
    job.add_hook(HookPoint::BeforeBackward, [sharder, synchronised](StepContext& c) {
      if (c.last_backward) *synchronised = c.sync_gradients;
      sharder->begin_micro_batch(c.sync_gradients, c.last_backward && c.sync_gradients);
    });
    job.add_hook(HookPoint::AfterBackward, [sharder](StepContext&) { sharder->after_backward(); });
    job.program.own(Stage::SyncGradients, [sharder](StepContext& c) {
      if (c.sync_gradients) c.metrics.emplace_back("fsdp_exposed_comm_ms", sharder->finish());
      else sharder->release_all();
    });
    job.set_offset_full_parameters([sharder](const NamedTensors& offsets) { sharder->set_full_offsets(offsets); });
    // The job keeps HSDP's groups alive, not the sharder: the parameters' gradient hooks hold the
    // sharder, which holds the parameters, so it outlives the job, and a group left at exit would
    // keep MPI from finalizing.
    job.add_hook(HookPoint::AfterStep, [sharder, groups = std::vector{shard_comm, replica_comm, expert_shard_comm}, hybrid = replica_comm != nullptr](StepContext& c) {
      const Sharder::Traffic traffic = sharder->take_traffic();
      c.metrics.emplace_back("fsdp_all_gathers", static_cast<double>(traffic.all_gathers));
      c.metrics.emplace_back("fsdp_gather_bytes", static_cast<double>(traffic.gather_bytes));
      c.metrics.emplace_back("fsdp_reduce_bytes", static_cast<double>(traffic.reduce_bytes));
      if (hybrid) c.metrics.emplace_back("fsdp_replica_reduce_bytes", static_cast<double>(traffic.replica_reduce_bytes));
      c.metrics.emplace_back("fsdp_sent_bytes", traffic.sent_bytes);
    });
    // Step metrics count the training step's collectives, not an evaluation's.
    job.add_hook(HookPoint::AfterEvaluate, [sharder](StepContext&) { sharder->release_all(), sharder->take_traffic(); });
    const auto own_gradients = job.local_gradients;  // core's: every parameter's
    sharding::shard_training_state(job, sharder->all_units());
    job.local_gradients = [own_gradients, pieces = job.local_gradients, synchronised] { return *synchronised ? pieces() : own_gradients(); };
  }
};

void register_components(Registry& registry) { registry.add(std::make_unique<FsdpPass>()); }

}  // namespace
}  // namespace strata::fsdp

STRATA_PLUGIN("fsdp", "0.2.0", strata::fsdp::register_components)
