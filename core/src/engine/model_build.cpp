// Building this rank's model. Every rank runs the model factory from the same generator state,
// so a block's values do not depend on the layout: tensor-parallel ranks draw each whole tensor
// and keep their piece (nn.h), and a pipeline rank builds every block in order but keeps only its
// own, each other block replaced by an nn::AbsentBlock the moment the factory adds it
// (nn::BlockFilter). Which blocks a rank keeps is the passes' call (Pass::blocks_to_build), made
// on an outline of the model: the same factory run with every block absent, the generators put
// back afterwards. So a pipeline rank's peak at start-up is its own blocks plus the largest other
// one, not the whole model (bench/results/pipeline_startup_cpu.md), at the price of running the
// factory twice. A pass that shards parameters over ranks (fsdp) sees the same outline, whose
// absent blocks know their parameters' shapes, and returns a BuildKeeper: as the factory adds each
// block, the keeper copies out this rank's part of it and turns its parameters into placeholders
// (nn::placeholder), so an fsdp rank's peak at start-up is its shards plus one whole block.
// Expert-parallel ranks keep only their experts of each MoE layer as it is constructed
// (nn::ExpertSplitAtBuild, like tensor-parallel pieces), in the outline too, so a keeper plans on
// the experts the rank holds (the outline's placements say which parameters those are). A
// keeper that composes with a pipeline (KeepsBuiltBlocks) sees the outline cut to the blocks this
// rank builds, which is the stage apply() will shard: a pipeline x fsdp rank keeps its shards of
// its stage only.
#include "model_build.h"

#include <algorithm>
#include <optional>
#include <string>

#include <ATen/ATen.h>

#include "strata/core/expert_split.h"
#include "strata/core/log.h"
#include "strata/core/process_memory.h"
#include "strata/errors.h"
#include "strata/model.h"
#include "strata/pass.h"
#include "strata/rng.h"

namespace strata::engine {

namespace {

// The model factory's build of this rank's shard; a model too large for this machine fails in the
// allocator, which is said as such instead of an internal error.
std::shared_ptr<nn::Model> create_or_explain(const ModelFactory& factory, const Config& model, const nn::TensorShard& shard) {
  try {
    return factory.create_shard(model, shard);
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    if (what.find("allocate") == std::string::npos && what.find("memory") == std::string::npos) throw;
    if (allocation_cap() > 0) {
      const double whole = 4.0 * static_cast<double>(factory.shape(model).parameters) / (1 << 20);
      throw UserError("[model] does not fit in this rank's memory: building it needed more than [job] rank_memory_limit_mb = " +
                      std::to_string(static_cast<int64_t>(allocation_cap() / (1 << 20))) + " (its fp32 weights alone are " +
                      std::to_string(static_cast<int64_t>(whole)) + " MiB; fsdp shards them as the model is built)");
    }
    throw UserError("[model] does not fit in this rank's memory (" + what.substr(0, what.find('\n')) + ")");
  }
}

// What the build held: parameters (a keeper's placeholders hold nothing), the blocks kept and by
// whom, and the memory before and after.
void log_build(const nn::Model& model, const std::optional<std::vector<size_t>>& keep, const std::string& chosen_by,
               const nn::BuildKeeper* keeper, double resident_before) {
  int64_t parameters = 0;
  for (const auto& p : model.parameters())
    if (!nn::is_placeholder(p)) parameters += p.numel();
  log::record("model built: " + std::to_string(parameters) + " parameters held" +
              (keep ? " (" + std::to_string(keep->size()) + " of " + std::to_string(model.num_blocks()) + " blocks, chosen by " +
                          chosen_by + ")"
                    : std::string(" (every block)")) +
              (keeper ? "; " + keeper->summary() : std::string()) + "; resident " +
              std::to_string(static_cast<int64_t>(resident_bytes() / (1 << 20))) + " MiB, peak " +
              std::to_string(static_cast<int64_t>(peak_resident_bytes() / (1 << 20))) + " MiB (" +
              std::to_string(static_cast<int64_t>(resident_before / (1 << 20))) + " MiB before the build); allocated " +
              std::to_string(static_cast<int64_t>(allocated_bytes() / (1 << 20))) + " MiB");
}

}  // namespace

void build_rank_model(const ResolvedStrategy& plan, const std::vector<size_t>& order, Job& job, bool weights_from_checkpoint) {
  const double resident_before = resident_bytes();
  const auto& factory = *static_cast<const ModelFactory*>(plan.model_component);
  const nn::TensorShard shard{job.topology->size(Dim::Tensor), job.topology->rank_in(Dim::Tensor)};
  // Expert-parallel ranks keep their experts as they are drawn, in the outline and in the build.
  const nn::ExpertSplitAtBuild experts({job.topology->size(Dim::Expert), job.topology->rank_in(Dim::Expert)});
  const Config model_config = weights_from_checkpoint ? without_init_from(plan.model) : plan.model;
  const auto build = [&] { return create_or_explain(factory, model_config, shard); };


  // The model with every block absent, drawing nothing: the generators are put back afterwards.
  const auto build_outline = [&]() {
    const RngSnapshot generators{job.device()};
    const nn::BlockFilter none([](size_t) { return false; });
    std::shared_ptr<nn::Model> built = build();
    generators.restore();
    return built;
  };
  std::shared_ptr<nn::Model> outline;
  const std::function<const nn::Model&()> get_outline = [&]() -> const nn::Model& {
    if (!outline) outline = build_outline();
    return *outline;
  };
  std::optional<std::vector<size_t>> keep;
  std::string chosen_by;
  for (size_t i : order) {
    const PassEntry& entry = plan.passes[i];
    auto wanted = entry.pass->blocks_to_build(entry.config, job, get_outline);
    if (!wanted) continue;
    if (keep) {  // two passes choosing: the blocks both keep
      std::vector<size_t> both;
      for (size_t b : *wanted)
        if (std::find(keep->begin(), keep->end(), b) != keep->end()) both.push_back(b);
      wanted = both;
    }
    keep = std::move(wanted);
    chosen_by += (chosen_by.empty() ? "" : ", ") + entry.pass->name();
  }
  // A keeper that knows KeepsBuiltBlocks plans on the outline of the blocks this rank builds.
  std::shared_ptr<nn::Model> built_outline;
  const std::function<const nn::Model&()> get_built_outline = [&]() -> const nn::Model& {
    if (!keep) return get_outline();
    if (!built_outline) built_outline = build_outline(), built_outline->keep_blocks(*keep);
    return *built_outline;
  };
  std::shared_ptr<nn::BuildKeeper> keeper;
  std::string kept_by;
  for (size_t i : order) {
    const PassEntry& entry = plan.passes[i];
    const auto* of_built = dynamic_cast<const KeepsBuiltBlocks*>(entry.pass);
    auto mine = of_built ? of_built->keeper_of_built_blocks(entry.config, job, get_built_outline)
                         : entry.pass->keeper_at_build(entry.config, job, get_outline);
    if (!mine) continue;
    if (keeper) throw std::logic_error("passes '" + kept_by + "' and '" + entry.pass->name() + "' both shard the model as it is built");
    keeper = std::move(mine), kept_by = entry.pass->name();
  }
  outline.reset(), built_outline.reset();
  release_free_memory();  // the outline's blocks, before the real ones are drawn

  std::optional<nn::BlockFilter> filter;
  if (keep) filter.emplace([&keep](size_t b) { return std::find(keep->begin(), keep->end(), b) != keep->end(); });
  std::optional<nn::KeepAtBuild> keeping;
  if (keeper) keeping.emplace(keeper.get());
  const std::shared_ptr<nn::Model> model = build();
  keeping.reset();
  filter.reset();
  log_build(*model, keep, chosen_by, keeper.get(), resident_before);
  // A placeholder moves as one element (the keeper's pass gives it storage on the job's device).
  if (keeper) {
    at::NoGradGuard no_grad;
    for (auto t : model->parameters(true))
      t.set_data(nn::is_placeholder(t) ? nn::placeholder(t.sizes(), t.options().device(job.device())) : t.to(job.device()));
    for (auto t : model->buffers(true)) t.set_data(t.to(job.device()));
  } else {
    model->to(job.device());
  }
  job.model = model;
  job.build_keeper = std::move(keeper);
}

}  // namespace strata::engine
