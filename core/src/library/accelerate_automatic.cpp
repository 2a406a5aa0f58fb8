// Strategy::automatic, ATorch's auto_accelerate done as `strata tune` does it, inside the
// program, with the same search (strata/core/tune.h, tune_trials.h): the candidates come from the
// passes' declarations, planned by the checks `strata plan` runs and ranked by the cost model;
// those over the memory budget are dropped; the best `trials` are then trained for a few steps
// each, in this process (InProcessTrialRunner: a model that lives in the program cannot be built
// by a fresh `strata run` process, which is how `strata tune` measures), and the fastest measured
// wins. A candidate whose trainer refuses to start is recorded and skipped; one that runs out of
// memory is not caught, which is why the memory budget is applied first. With one candidate, or
// trials <= 1, the cost model's first is taken unmeasured.
#include "accelerate_automatic.h"

#include <cstdio>
#include <filesystem>

#include "strata/core/tune_trials.h"
#include "strata/errors.h"

namespace strata {
namespace {

// The layout and the passes and options chosen beyond it ("tensor 2 (tensor_parallel) with
// pass.tensor_parallel.sequence_parallel = false").
std::string name_of(const TuneCandidate& c) {
  const std::string name = c.layout.empty() ? std::string("one process") : c.layout, extra = other_choices(c);
  return extra.empty() ? name : name + " with " + extra;
}

std::string format_ms(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f ms", seconds * 1000);
  return buf;
}

}  // namespace

RawStrategy automatic_strategy(const RawStrategy& base, const ComponentRegistry& registry, const Strategy& strategy, int64_t world_size,
                               const RunOptions& run, std::string& status) {
  if (strategy.automatic_ranks() != world_size)
    throw UserError("Strategy::automatic(" + std::to_string(strategy.automatic_ranks()) + ") is for " +
                    std::to_string(strategy.automatic_ranks()) + " ranks, but " + std::to_string(world_size) + " started");
  const TuneSpace space = generate_candidates(base, registry, world_size, HardwareRates{});
  const double budget = strategy.memory_gb() * double(1 << 30);
  TrialSearch search = sort_candidates(space, budget);
  if (search.ranked.empty())
    throw UserError("no candidate strategy for " + std::to_string(world_size) + " ranks plans" +
                    (budget > 0 ? " within " + std::to_string(strategy.memory_gb()) + " GB per rank" : std::string()) +
                    (space.candidates.empty() ? std::string() : "; the first refused: " + space.candidates.front().rejected));
  const std::string planned = std::to_string(search.ranked.size()) + " candidates the cost model planned" +
                              (budget > 0 ? " within the memory budget" : std::string());
  const TuneCandidate& predicted_first = *search.ranked.front().candidate;
  const size_t trials = std::min(search.ranked.size(), static_cast<size_t>(std::max(0, strategy.trials())));
  if (trials <= 1) {
    status = "automatic strategy: " + name_of(predicted_first) + ", the cost model's fastest of " + planned +
             " (predicted at default hardware rates, not measured)";
    return predicted_first.raw;
  }

  // The trials' run directories sit beside the run's own, which its trainer claims afterwards.
  // One round each: the ranks must decide alike, and a second round's timing is what a time
  // budget or a cache would make rank-dependent; neither is used here.
  const std::filesystem::path root =
      (run.out_dir.empty() ? std::filesystem::path(predicted_first.checked.plan.job.get_string("run_dir")) : run.out_dir).string() + ".trials";
  InProcessTrialRunner runner(registry, run, root);
  TrialSettings settings;
  settings.trials = trials, settings.rounds = 1, settings.memory_budget_bytes = budget, settings.ranks = world_size;
  measure_candidates(search, runner, settings);
  std::string measured;
  for (const TrialOutcome& o : search.ranked)
    if (o.trial) measured += (measured.empty() ? "" : "; ") + name_of(*o.candidate) + " " + (o.trial->ok ? format_ms(o.trial->step_s) : "failed: " + o.trial->verdict);
  if (!search.best) throw UserError("Strategy::automatic: none of the " + std::to_string(trials) + " candidates measured started (" + measured + ")");
  const TuneCandidate& best = *search.ranked[*search.best].candidate;
  status = "automatic strategy: " + name_of(best) + ", the fastest of the cost model's best " + std::to_string(trials) + " of " + planned +
           ", measured in this process (median step time of " + std::to_string(runner.measured_steps()) + " steps after " +
           std::to_string(runner.warmup_steps()) + " warm-up, rank 0: " + measured + "; trial runs in " + root.string() + ")";
  return best.raw;
}

}  // namespace strata
