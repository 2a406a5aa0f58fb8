// InProcessTrialRunner (strata/core/tune_trials.h): a trial is a fresh Trainer in this process,
// for Strategy::automatic, whose model lives in the user's program and so cannot be built by a
// `strata run` process. Every rank runs the same trials in the same order; rank 0's median step
// time is broadcast, so every rank sees the same figures and chooses alike.
#include <chrono>

#include <ATen/ATen.h>

#include "strata/core/statistics.h"
#include "strata/core/tune_trials.h"
#include "strata/errors.h"

namespace strata {

InProcessTrialRunner::InProcessTrialRunner(const ComponentRegistry& registry, RunOptions run, std::filesystem::path out_dir)
    : registry_(registry), run_(std::move(run)), out_dir_(std::move(out_dir)) {}

TrialResult InProcessTrialRunner::run(const TuneCandidate& candidate, size_t rank, int64_t round) {
  TrialResult result;
  const int64_t steps = warmup_steps() + measured_steps();
  RawStrategy raw = candidate.raw;
  Diagnostics diagnostics;
  apply_overrides(raw, trial_overrides(steps), {}, diagnostics);
  CheckedPlan checked;
  if (!diagnostics.ok() || !check_plan(raw, registry_, candidate.checked.plan.layout.world_size, checked, diagnostics)) {
    result.verdict = diagnostics.str();
    return result;
  }
  RunOptions options = run_;
  const std::string name = "candidate_" + std::to_string(rank);
  options.out_dir = out_dir_ / (round == 1 ? name : name + "_round" + std::to_string(round));
  options.resume = false, options.overwrite = true;
  const auto start = std::chrono::steady_clock::now();
  try {
    Trainer trainer(checked.plan, checked.order, registry_, options);
    std::vector<double> times;
    for (int64_t s = 0; s < steps; ++s) {
      const double ms = trainer.step().step_ms;
      if (s >= warmup_steps()) times.push_back(ms);
    }
    at::Tensor step_ms = at::tensor(median(times), at::kDouble).to(trainer.job().device());
    trainer.job().topology->world().broadcast(step_ms, 0)->wait();
    result.step_s = step_ms.cpu().item<double>() / 1000.0;
  } catch (const UserError& e) {
    result.verdict = e.what();
    return result;
  }
  result.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.ok = true, result.verdict = "ok";
  return result;
}

}  // namespace strata
