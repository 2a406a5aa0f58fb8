// Strategy::automatic, ATorch's auto_accelerate done as `strata tune` does it, inside the
// program: the candidates come from the passes' declarations (generate_candidates), planned by
// the checks `strata plan` runs and ranked by the cost model; those over the memory budget are
// dropped; the best `trials` are then trained for a few steps each, in this process (a model
// that lives in the program cannot be built by a fresh `strata run` process, which is how
// `strata tune` measures), one fresh Trainer at a time, and the fastest measured wins. Rank 0's
// step times decide (broadcast to every rank), so all ranks choose alike. A candidate whose
// trainer refuses to start is recorded and skipped; one that runs out of memory is not caught,
// which is why the memory budget is applied first. With one candidate, or trials <= 1, the cost
// model's first is taken unmeasured.
#include "accelerate_automatic.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>

#include <ATen/ATen.h>

#include "strata/core/trainer.h"
#include "strata/core/tune.h"
#include "strata/errors.h"

namespace strata {
namespace {

constexpr int kWarmupSteps = 2, kMeasuredSteps = 3;

std::string format_ms(double ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f ms", ms);
  return buf;
}

// The layout and the passes and options chosen beyond it ("tensor 2 (tensor_parallel) with
// pass.tensor_parallel.sequence_parallel = false").
std::string name_of(const TuneCandidate& c) {
  std::string name = c.layout.empty() ? std::string("one process") : c.layout, extra;
  for (const auto& choice : c.choices)
    if (choice.rfind("parallel.", 0) != 0 && (choice.rfind("pass ", 0) != 0 || c.layout.find("(" + choice.substr(5) + ")") == std::string::npos))
      extra += (extra.empty() ? "" : ", ") + choice;
  return extra.empty() ? name : name + " with " + extra;
}

// Rank 0's median step time of `candidate` trained for a few steps in `dir`, on every rank;
// +infinity, with `failure` set, when its trainer refuses to start.
double measure(const TuneCandidate& candidate, const ComponentRegistry& registry, const RunOptions& run, const std::filesystem::path& dir,
               std::string& failure) {
  RawStrategy raw = candidate.raw;
  Diagnostics diagnostics;
  apply_overrides(raw,
                  {"job.steps=" + std::to_string(kWarmupSteps + kMeasuredSteps), "job.eval_every=0", "job.checkpoint_every=0",
                   "job.flash_every=0", "job.max_restarts=0", "job.log_every=1000", "job.profile_steps=0"},
                  {}, diagnostics);
  CheckedPlan checked;
  if (!diagnostics.ok() || !check_plan(raw, registry, candidate.checked.plan.layout.world_size, checked, diagnostics)) {
    failure = diagnostics.str();
    return std::numeric_limits<double>::infinity();
  }
  RunOptions options = run;
  options.out_dir = dir, options.resume = false, options.overwrite = true;
  try {
    Trainer trainer(checked.plan, checked.order, registry, options);
    std::vector<double> times;
    for (int s = 0; s < kWarmupSteps + kMeasuredSteps; ++s) {
      const double ms = trainer.step().step_ms;
      if (s >= kWarmupSteps) times.push_back(ms);
    }
    std::sort(times.begin(), times.end());
    at::Tensor median = at::tensor(times[times.size() / 2], at::kDouble).to(trainer.job().device());
    trainer.job().topology->world().broadcast(median, 0)->wait();
    return median.cpu().item<double>();
  } catch (const UserError& e) {
    failure = e.what();
    return std::numeric_limits<double>::infinity();
  }
}

}  // namespace

RawStrategy automatic_strategy(const RawStrategy& base, const ComponentRegistry& registry, const Strategy& strategy, int64_t world_size,
                               const RunOptions& run, std::string& status) {
  if (strategy.automatic_ranks() != world_size)
    throw UserError("Strategy::automatic(" + std::to_string(strategy.automatic_ranks()) + ") is for " +
                    std::to_string(strategy.automatic_ranks()) + " ranks, but " + std::to_string(world_size) + " started");
  const TuneSpace space = generate_candidates(base, registry, world_size, HardwareRates{});
  const double budget = strategy.memory_gb() * double(1 << 30);
  std::vector<const TuneCandidate*> fitting;
  for (const auto& c : space.candidates)
    if (c.rejected.empty() && (budget <= 0 || c.predicted_bytes <= budget)) fitting.push_back(&c);
  if (fitting.empty())
    throw UserError("no candidate strategy for " + std::to_string(world_size) + " ranks plans" +
                    (budget > 0 ? " within " + std::to_string(strategy.memory_gb()) + " GB per rank" : std::string()) +
                    (space.candidates.empty() ? std::string() : "; the first refused: " + space.candidates.front().rejected));
  const std::string planned = std::to_string(fitting.size()) + " candidates the cost model planned" +
                              (budget > 0 ? " within the memory budget" : std::string());
  const size_t trials = std::min(fitting.size(), static_cast<size_t>(std::max(0, strategy.trials())));
  if (trials <= 1) {
    status = "automatic strategy: " + name_of(*fitting.front()) + ", the cost model's fastest of " + planned +
             " (predicted at default hardware rates, not measured)";
    return fitting.front()->raw;
  }

  // The trials' run directories sit beside the run's own, which its trainer claims afterwards.
  const std::filesystem::path root =
      (run.out_dir.empty() ? std::filesystem::path(fitting.front()->checked.plan.job.get_string("run_dir")) : run.out_dir).string() +
      ".trials";
  size_t best = 0;
  std::vector<double> ms(trials);
  std::string measured;
  for (size_t i = 0; i < trials; ++i) {
    std::string failure;
    ms[i] = measure(*fitting[i], registry, run, root / ("candidate_" + std::to_string(i + 1)), failure);
    measured += (i ? "; " : "") + name_of(*fitting[i]) + " " + (std::isfinite(ms[i]) ? format_ms(ms[i]) : "failed: " + failure);
    if (ms[i] < ms[best]) best = i;
  }
  if (!std::isfinite(ms[best])) throw UserError("Strategy::automatic: none of the " + std::to_string(trials) + " candidates measured started (" + measured + ")");
  status = "automatic strategy: " + name_of(*fitting[best]) + ", the fastest of the cost model's best " + std::to_string(trials) + " of " +
           planned + ", measured in this process (median step time of " + std::to_string(kMeasuredSteps) + " steps after " +
           std::to_string(kWarmupSteps) + " warm-up, rank 0: " + measured + "; trial runs in " + root.string() + ")";
  return fitting[best]->raw;
}

}  // namespace strata
