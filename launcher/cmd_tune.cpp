// strata tune: search the strategies for N ranks around the one given. The search is core's
// (strata/core/tune.h: candidates and cost model; strata/core/tune_trials.h: the measured trials,
// in fresh `strata run` processes, and their cache); this file reads the arguments, prints the
// ranking and each trial as it ends, and writes tune.jsonl and the chosen strategy.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "strata/core/tune.h"
#include "strata/core/tune_trials.h"

namespace strata::cli {

namespace {

namespace fs = std::filesystem;

constexpr size_t kDefaultTrials = 6;     // --top: candidates measured, in predicted order
constexpr int64_t kDefaultRounds = 3;    // --rounds: trials of each contender, the first included

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f", bytes / (1 << 20));
  return buf;
}

std::string choices_column(const TuneCandidate& c) {
  const std::string choices = other_choices(c);
  return choices.empty() ? "-" : choices;
}

// Cached once per machine and rank count (TrialCache::rates); --remeasure measures them again.
HardwareRates machine_rates(TrialCache& cache, int64_t ranks, bool remeasure, bool& cached) {
  if (auto hit = cache.rates(ranks); hit && !remeasure) {
    cached = true;
    return *hit;
  }
  const HardwareRates r = measure_rates(ranks, fs::read_symlink("/proc/self/exe"));
  cache.add_rates(ranks, r);
  cached = false;
  return r;
}

// `calibration`: what the first trial measured above the model (added to predicted_bytes).
nlohmann::json outcome_json(const TrialOutcome& o, double calibration) {
  const TuneCandidate& c = *o.candidate;
  nlohmann::json j{{"layout", c.layout}, {"choices", c.choices}, {"verdict", o.verdict}};
  if (o.rank > 0) j["predicted_rank"] = o.rank;
  if (c.rejected.empty())
    j["predicted_s"] = c.predicted_s, j["predicted_bytes"] = c.predicted_bytes + calibration, j["predicted_model_bytes"] = c.predicted_bytes,
    j["cost"] = {{"flops", c.cost.flops}, {"comm_bytes", c.cost.comm_bytes}, {"messages", c.cost.messages}, {"bubble", c.cost.bubble},
                 {"layer_micro_batches", c.cost.layers_per_rank * static_cast<double>(c.cost.micro_batches)},
                 {"model_state_bytes", c.cost.weight_bytes + c.cost.gradient_bytes + c.cost.optimizer_bytes},
                 {"activation_bytes", c.cost.activation_bytes * c.cost.in_flight}, {"transient_bytes", c.cost.transient_bytes}};
  if (o.trial && o.trial->ok) j["measured_s"] = o.trial->step_s, j["measured_bytes"] = o.trial->peak_bytes, j["cached"] = o.cached;
  if (o.samples.size() > 1) j["measured_rounds_s"] = o.samples;
  if (o.trial && !o.cached) j["trial_wall_s"] = o.trial->wall_s;
  return j;
}

// The ranking before any trial: the top of those that plan, then what the budget and the plan
// checks left out.
void print_ranking(const Args& args, const TuneSpace& space, const TrialSearch& search, const HardwareRates& rates, bool rates_cached) {
  std::map<std::string, std::pair<size_t, const TuneCandidate*>> refused;  // reason -> count, first
  size_t over_budget = 0;
  const TuneCandidate* smallest_over = nullptr;
  for (const auto& o : search.others) {
    const TuneCandidate& c = *o.candidate;
    if (!c.rejected.empty()) {
      auto& slot = refused[c.rejected];
      if (slot.first++ == 0) slot.second = &c;
    } else if (++over_budget, !smallest_over || c.predicted_bytes < smallest_over->predicted_bytes) {
      smallest_over = &c;
    }
  }
  const auto& ranked = search.ranked;
  std::printf("strata tune %s -n %ld: %zu candidates from the loaded passes' declarations%s; %zu plan, %zu refused by plan checks",
              args.positional[0].c_str(), static_cast<long>(args.ranks), space.candidates.size(),
              space.truncated ? " (truncated)" : "", ranked.size() + over_budget, space.candidates.size() - ranked.size() - over_budget);
  if (args.memory_gb > 0) std::printf(", %zu over --memory-gb %g", over_budget, args.memory_gb);
  if (space.duplicates > 0) std::printf("; %zu that plan the same as another dropped", space.duplicates);
  std::printf("\nrates: matmul %.1f GFLOP/s on one thread, parameter pass %.2f ns, layer overhead %.0f us, %ld ranks on %u cores; "
              "all-reduce %.2f GB/s, %.0f us latency (strata doctor)%s\n\n",
              rates.flops_per_s / 1e9, rates.parameter_pass_s * 1e9, rates.layer_overhead_s * 1e6, static_cast<long>(args.ranks),
              std::max(1u, std::thread::hardware_concurrency()), rates.bytes_per_s / 1e9, rates.message_latency_s * 1e6,
              rates_cached ? "; cached, --remeasure measures them again" : "");
  const size_t shown = std::min<size_t>(ranked.size(), args.dry_run && args.top > 0 ? static_cast<size_t>(args.top) : 20);
  std::printf("%5s %12s %14s  %-40s %s\n", "rank", "predicted s", "peak MiB/rank", "layout", "other choices");
  for (size_t i = 0; i < shown; ++i)
    std::printf("%5zu %12.4f %14s  %-40s %s\n", i + 1, ranked[i].candidate->predicted_s, mib(ranked[i].candidate->predicted_bytes).c_str(),
                ranked[i].candidate->layout.c_str(), choices_column(*ranked[i].candidate).c_str());
  if (shown < ranked.size()) std::printf("  ... %zu more%s\n", ranked.size() - shown, args.dry_run ? " (--top N shows more)" : "");
  if (ranked.empty()) std::printf("  (none)\n");
  if (smallest_over)
    std::printf("\nOver the memory budget: %zu; the smallest needs %s MiB per rank: %s; %s\n", over_budget,
                mib(smallest_over->predicted_bytes).c_str(), smallest_over->layout.c_str(), choices_column(*smallest_over).c_str());
  if (!refused.empty()) {
    std::printf("\nRefused by the plan checks (count, reason, first candidate):\n");
    for (const auto& [reason, slot] : refused)
      std::printf("  %3zu  %s\n       e.g. %s; %s\n", slot.first, reason.c_str(), slot.second->layout.c_str(), choices_column(*slot.second).c_str());
  }
}

// What `strata tune` prints as the trials go.
void print_as_measured(TrialSettings& settings, const TrialSearch& search) {
  settings.measured = [&search](const TrialOutcome& o) {
    std::printf("%5zu %12.4f %11s %14s %12s  %-40s %s\n", o.rank, o.candidate->predicted_s,
                o.trial->ok ? std::to_string(o.trial->step_s).substr(0, 7).c_str() : "-", mib(search.predicted_bytes(o)).c_str(),
                o.trial->ok ? mib(o.trial->peak_bytes).c_str() : "-", o.candidate->layout.c_str(), o.verdict.c_str());
    std::fflush(stdout);
  };
  settings.confirming = [&settings](const std::vector<const TrialOutcome*>& contenders) {
    std::printf("\nConfirming the %zu within %.0f%% of the fastest: %ld more trials each, interleaved (median of all):\n",
                contenders.size(), 100 * (settings.contender_margin - 1), static_cast<long>(settings.rounds - 1));
  };
  settings.confirmed = [](const TrialOutcome& o) {
    std::string trials;
    for (double sample : o.samples) trials += (trials.empty() ? "" : ", ") + std::to_string(sample).substr(0, 7);
    std::printf("  %-40s %s: median %.4f s (%s)\n", o.candidate->layout.c_str(), choices_column(*o.candidate).c_str(), o.trial->step_s,
                trials.c_str());
  };
  settings.out_of_time = [&settings] { std::printf("  --budget %.0f s spent: the rest are not measured\n", settings.time_budget_s); };
}

// The chosen strategy, with a header that says how it was chosen and how to run it.
void write_best(const Args& args, const TrialSearch& search, const TrialRunner& runner, const fs::path& out_dir, const fs::path& output) {
  const TrialOutcome& best = search.ranked[*search.best];
  const std::string how = (best.samples.size() > 1 ? "the median of " + std::to_string(best.samples.size()) + " trials, each " : std::string()) +
                          "the median of " + std::to_string(runner.measured_steps()) + " steps after " + std::to_string(runner.warmup_steps()) +
                          " warm-up";
  char header[1024];
  std::snprintf(header, sizeof header,
                "# Chosen by `strata tune %s -n %ld`%s: %s; %s.\n"
                "# Measured %.4f s per step (%s) and %s MiB peak on the busiest rank;\n"
                "# predicted %.4f s and %s MiB (rank %zu of %zu by the cost model); %zu candidates measured, every one in %s.\n"
                "# Run it with: strata run %s -n %ld\n",
                args.positional[0].c_str(), static_cast<long>(args.ranks),
                args.memory_gb > 0 ? (" --memory-gb " + std::to_string(args.memory_gb).substr(0, 6)).c_str() : "", best.candidate->layout.c_str(),
                choices_column(*best.candidate).c_str(), best.trial->step_s, how.c_str(), mib(best.trial->peak_bytes).c_str(), best.candidate->predicted_s,
                mib(search.predicted_bytes(best)).c_str(), best.rank, search.ranked.size(), search.measured, (out_dir / "tune.jsonl").c_str(),
                output.c_str(), static_cast<long>(args.ranks));
  std::ofstream(output) << raw_strategy_toml(best.candidate->raw, header);
  std::printf("\nBest: %s; %s: %.4f s per step measured. Written to %s (all candidates: %s)\n", best.candidate->layout.c_str(),
              choices_column(*best.candidate).c_str(), best.trial->step_s, output.c_str(), (out_dir / "tune.jsonl").c_str());
}

}  // namespace

int run_tune(const Args& args) {
  allow_only(args, {"-n", "--ranks", "--set", "--disable", "--memory-gb", "--dry-run", "--top", "--rounds", "--trial-steps", "--budget", "--out", "-o", "--output",
                    "--finetune", "--remeasure"});
  if (args.positional.size() != 1) throw UserError("'strata tune' takes one strategy file; see strata tune --help");
  if (args.dry_run && (!args.out_dir.empty() || !args.output.empty() || args.budget_s > 0 || args.rounds > 0 ||
                       std::find(args.given.begin(), args.given.end(), "--trial-steps") != args.given.end()))
    throw UserError("'strata tune --dry-run' measures nothing and writes nothing: drop --out, -o, --rounds, --trial-steps and --budget");
  Diagnostics diagnostics;
  RawStrategy raw = load_strategy_file(args.positional[0], diagnostics);
  if (diagnostics.ok()) apply_overrides(raw, args.sets, args.disables, diagnostics);
  if (!diagnostics.ok()) {
    std::cerr << diagnostics.str();
    return 2;
  }
  ComponentRegistry registry;
  load_plugins(registry, strategy_plugin_path(raw));
  if (args.finetune && !open_to_finetune(raw, registry, args.ranks, diagnostics)) {
    std::cerr << diagnostics.str() << "strata tune: error: --finetune starts from a strategy that plans on " << args.ranks << " ranks\n";
    return 2;
  }
  TrialCache cache;
  bool rates_cached = false;
  const HardwareRates rates = machine_rates(cache, args.ranks, args.remeasure, rates_cached);
  const TuneSpace space = generate_candidates(raw, registry, args.ranks, rates);
  TrialSearch search = sort_candidates(space, args.memory_gb * double(1 << 30));
  print_ranking(args, space, search, rates, rates_cached);
  if (search.ranked.empty()) return 2;
  if (args.dry_run) return 0;
  if (const std::string& why = search.ranked.front().candidate->checked.data_not_checked; !why.empty())
    throw UserError("the trials need the data, which cannot be opened here (" + why + "); --dry-run ranks the candidates without it");

  const fs::path out_dir = args.out_dir.empty() ? fs::path("runs/tune") : fs::path(args.out_dir);
  fs::create_directories(out_dir);
  ProcessTrialRunner runner(fs::read_symlink("/proc/self/exe"), out_dir, args.ranks, args.trial_warmup_steps, args.trial_measured_steps);
  TrialSettings settings;
  settings.trials = args.top > 0 ? static_cast<size_t>(args.top) : kDefaultTrials;
  settings.rounds = args.rounds > 0 ? args.rounds : kDefaultRounds;
  settings.memory_budget_bytes = args.memory_gb * double(1 << 30), settings.time_budget_s = args.budget_s;
  settings.cache = &cache, settings.reuse_cached = !args.remeasure, settings.ranks = args.ranks;
  print_as_measured(settings, search);
  std::printf("\nMeasuring the top %zu (%ld warm-up + %ld measured steps each, fresh processes; logs in %s):\n", settings.trials,
              static_cast<long>(runner.warmup_steps()), static_cast<long>(runner.measured_steps()), out_dir.c_str());
  std::printf("%5s %12s %11s %14s %12s  %-40s %s\n", "rank", "predicted s", "measured s", "predicted MiB", "measured MiB", "layout", "verdict");
  measure_candidates(search, runner, settings);

  std::ofstream jsonl(out_dir / "tune.jsonl");
  for (const auto& o : search.ranked) jsonl << outcome_json(o, search.calibration).dump() << "\n";
  for (const auto& o : search.others) jsonl << outcome_json(o, search.calibration).dump() << "\n";
  if (!search.best) {
    std::fprintf(stderr, "strata tune: error: none of the %zu measured candidates ran within the budget; see %s\n", search.measured,
                 (out_dir / "tune.jsonl").c_str());
    return 2;
  }
  write_best(args, search, runner, out_dir, args.output.empty() ? out_dir / "best.toml" : fs::path(args.output));
  return 0;
}

}  // namespace strata::cli
