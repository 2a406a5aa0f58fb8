// strata tune: search the strategies for N ranks around the one given (strata/core/tune.h).
// The candidates are ranked by the analytic cost model; the top K that fit the memory budget are
// then trained for a few steps each in fresh processes (tune_trial.h), in predicted order, until
// K are measured or --budget runs out; the fastest that ran is written as a strategy. Measured
// results are cached by the candidate's strategy text, rank count and machine, so tuning the same
// strategy again does not train again.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <iostream>
#include <map>
#include <optional>
#include <thread>
#include <vector>


#include <nlohmann/json.hpp>

#include "commands.h"
#include "strata/core/cpu_features.h"
#include "common.h"
#include "strata/core/operator_table.h"
#include "strata/core/tune.h"
#include "strata/core/version.h"
#include "tune_rates.h"
#include "tune_trial.h"

namespace strata::cli {

namespace {

namespace fs = std::filesystem;

constexpr size_t kDefaultTrials = 6;     // --top: candidates measured, in predicted order
constexpr double kContenderMargin = 1.25;  // measured within this of the fastest: measured again
constexpr int64_t kDefaultRounds = 3;    // --rounds: trials of each contender, the first included

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f", bytes / (1 << 20));
  return buf;
}

// The choices of a candidate other than its layout (which the layout column shows).
std::string other_choices(const TuneCandidate& c) {
  std::string out;
  for (const auto& choice : c.choices)
    if (choice.rfind("parallel.", 0) != 0 && !(choice.rfind("pass ", 0) == 0 && c.layout.find("(" + choice.substr(5) + ")") != std::string::npos))
      out += (out.empty() ? "" : "; ") + choice;
  return out.empty() ? "-" : out;
}

// What the cache key says about the machine: CPU model, cores, Strata and libtorch versions.
std::string machine_fingerprint() {
  const VersionInfo v = version_info();
  // The leading space: keys written before the model came from cpu_features() had it.
  return " " + cpu_features().model + "|" + std::to_string(std::thread::hardware_concurrency()) + "|" + v.strata + "|" + v.torch;
}

fs::path cache_file() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const fs::path base = xdg && *xdg ? fs::path(xdg) : fs::path(home ? home : ".") / ".cache";
  return base / "strata" / "tune_cache.jsonl";
}

std::map<std::string, nlohmann::json> read_cache() {
  std::map<std::string, nlohmann::json> out;
  std::ifstream in(cache_file());
  for (std::string line; std::getline(in, line);) {
    auto record = nlohmann::json::parse(line, nullptr, false);
    if (!record.is_discarded() && record.contains("key")) out[record["key"].get<std::string>()] = record;
  }
  return out;
}

void append_cache(const std::string& key, const TrialResult& r) {
  std::error_code ec;
  fs::create_directories(cache_file().parent_path(), ec);
  std::ofstream(cache_file(), std::ios::app) << nlohmann::json{{"key", key}, {"step_s", r.step_s}, {"peak_bytes", r.peak_bytes}}.dump() << "\n";
}

std::string hex_key(const std::string& text) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016zx", std::hash<std::string>{}(text));
  return buf;
}

// The machine's rates are cached with the trials: measured afresh each time, they vary by 10-60%
// on a shared machine, which reorders near ties, so a second tune would measure candidates the
// first did not and the cache would not answer it. Once per machine and rank count (the latest
// record wins); --remeasure measures them again.
HardwareRates machine_rates(int64_t ranks, bool remeasure, bool& cached) {
  const std::string key = "rates|" + machine_fingerprint() + "|" + std::to_string(ranks);
  const auto cache = read_cache();
  if (auto hit = cache.find(key); hit != cache.end() && !remeasure) {
    const nlohmann::json& j = hit->second;
    HardwareRates r;
    r.flops_per_s = j.value("flops_per_s", r.flops_per_s), r.oversubscription = j.value("oversubscription", r.oversubscription);
    r.bytes_per_s = j.value("bytes_per_s", r.bytes_per_s), r.message_latency_s = j.value("message_latency_s", r.message_latency_s);
    r.layer_overhead_s = j.value("layer_overhead_s", r.layer_overhead_s), r.parameter_pass_s = j.value("parameter_pass_s", r.parameter_pass_s);
    r.process_bytes = j.value("process_bytes", r.process_bytes);
    cached = true;
    return r;
  }
  const HardwareRates r = measure_rates(ranks);
  std::error_code ec;
  fs::create_directories(cache_file().parent_path(), ec);
  std::ofstream(cache_file(), std::ios::app)
      << nlohmann::json{{"key", key}, {"flops_per_s", r.flops_per_s}, {"oversubscription", r.oversubscription},
                        {"bytes_per_s", r.bytes_per_s}, {"message_latency_s", r.message_latency_s},
                        {"layer_overhead_s", r.layer_overhead_s}, {"parameter_pass_s", r.parameter_pass_s},
                        {"process_bytes", r.process_bytes}}.dump()
      << "\n";
  cached = false;
  return r;
}

// --finetune (ATorch's finetune_strategy): the strategy must plan as it is; its layout and passes
// stay, and the values it gives searched keys (Schema::tuned) become starting points: they are
// removed so the search tries every declared value of them, and passes that declare
// TuneUse::Try are tried on and off. The strategy itself is one of the candidates when its values
// are among the declared ones.
bool open_to_finetune(RawStrategy& raw, const ComponentRegistry& registry, int64_t ranks) {
  Diagnostics diagnostics;
  CheckedPlan checked;
  OperatorTable::global().install(registry);
  if (!check_plan(raw, registry, ranks, checked, diagnostics)) {
    std::cerr << diagnostics.str() << "strata tune: error: --finetune starts from a strategy that plans on " << ranks << " ranks\n";
    return false;
  }
  const ParallelLayout& l = checked.plan.layout;
  const std::pair<const char*, int64_t> sizes[] = {{"data", l.data}, {"tensor", l.tensor}, {"pipeline", l.pipeline}, {"context", l.context}};
  for (const auto& [dim, size] : sizes) raw.parallel.set(dim, RawEntry{Value{size}, SourcePos{"strata tune --finetune", 0, 0}, Origin::CommandLine});
  auto open = [](RawSection& section, const Schema& schema) {
    std::erase_if(section.entries, [&](const auto& entry) {
      const KeySpec* spec = schema.find(entry.first);
      return spec && !spec->tune_values.empty();
    });
  };
  open(raw.job, job_schema());
  for (auto& section : raw.passes) {
    const RawEntry* name = section.find("name");
    if (const Pass* pass = name && std::holds_alternative<std::string>(name->value) ? registry.find_pass(std::get<std::string>(name->value)) : nullptr)
      open(section, pass->info().schema);
  }
  return true;
}

// One candidate's record in tune.jsonl and the measured table.
struct Outcome {
  const TuneCandidate* candidate = nullptr;
  std::string verdict;  // "refused: ...", "over the memory budget (predicted)", "not measured", "measured", "best", ...
  std::optional<TrialResult> trial;  // step_s: the median of `samples` once confirmed
  bool cached = false;
  std::string name;                  // candidate-N: its strategy file and run directories in --out
  std::string cache_key;
  std::vector<double> samples;       // step_s of each trial of it, in order
};

// `calibration`: what the first trial measured above the model (added to predicted_bytes).
nlohmann::json outcome_json(const Outcome& o, size_t rank, double calibration) {
  const TuneCandidate& c = *o.candidate;
  nlohmann::json j{{"layout", c.layout}, {"choices", c.choices}, {"verdict", o.verdict}};
  if (rank > 0) j["predicted_rank"] = rank;
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

}  // namespace

int run_tune(const Args& args) {
  allow_only(args, {"-n", "--ranks", "--set", "--disable", "--memory-gb", "--dry-run", "--top", "--rounds", "--budget", "--out", "-o", "--output", "--finetune", "--remeasure"});
  if (args.positional.size() != 1) throw UserError("'strata tune' takes one strategy file; see strata tune --help");
  if (args.dry_run && (!args.out_dir.empty() || !args.output.empty() || args.budget_s > 0 || args.rounds > 0))
    throw UserError("'strata tune --dry-run' measures nothing and writes nothing: drop --out, -o, --rounds and --budget");
  Diagnostics diagnostics;
  RawStrategy raw = load_strategy_file(args.positional[0], diagnostics);
  if (diagnostics.ok()) apply_overrides(raw, args.sets, args.disables, diagnostics);
  if (!diagnostics.ok()) {
    std::cerr << diagnostics.str();
    return 2;
  }
  ComponentRegistry registry;
  load_plugins(registry, strategy_plugin_path(raw));
  if (args.finetune && !open_to_finetune(raw, registry, args.ranks)) return 2;
  bool rates_cached = false;
  const HardwareRates rates = machine_rates(args.ranks, args.remeasure, rates_cached);
  const TuneSpace space = generate_candidates(raw, registry, args.ranks, rates);
  const double budget = args.memory_gb * double(1 << 30);

  std::vector<Outcome> ranked, others;
  std::map<std::string, std::pair<size_t, const TuneCandidate*>> refused;  // reason -> count, first
  size_t over_budget = 0;
  const TuneCandidate* smallest_over = nullptr;
  for (const auto& c : space.candidates) {
    if (!c.rejected.empty()) {
      auto& slot = refused[c.rejected];
      if (slot.first++ == 0) slot.second = &c;
      others.push_back({&c, "refused: " + c.rejected});
    } else if (budget > 0 && c.predicted_bytes > budget) {
      ++over_budget;
      if (!smallest_over || c.predicted_bytes < smallest_over->predicted_bytes) smallest_over = &c;
      others.push_back({&c, "over --memory-gb (predicted)"});
    } else {
      ranked.push_back({&c, "not measured"});
    }
  }
  std::printf("strata tune %s -n %ld: %zu candidates from the loaded passes' declarations%s; %zu plan, %zu refused by plan checks",
              args.positional[0].c_str(), static_cast<long>(args.ranks), space.candidates.size(),
              space.truncated ? " (truncated)" : "", ranked.size() + over_budget, space.candidates.size() - ranked.size() - over_budget);
  if (budget > 0) std::printf(", %zu over --memory-gb %g", over_budget, args.memory_gb);
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
                ranked[i].candidate->layout.c_str(), other_choices(*ranked[i].candidate).c_str());
  if (shown < ranked.size()) std::printf("  ... %zu more%s\n", ranked.size() - shown, args.dry_run ? " (--top N shows more)" : "");
  if (ranked.empty()) std::printf("  (none)\n");
  if (smallest_over)
    std::printf("\nOver the memory budget: %zu; the smallest needs %s MiB per rank: %s; %s\n", over_budget,
                mib(smallest_over->predicted_bytes).c_str(), smallest_over->layout.c_str(), other_choices(*smallest_over).c_str());
  if (!refused.empty()) {
    std::printf("\nRefused by the plan checks (count, reason, first candidate):\n");
    for (const auto& [reason, slot] : refused)
      std::printf("  %3zu  %s\n       e.g. %s; %s\n", slot.first, reason.c_str(), slot.second->layout.c_str(), other_choices(*slot.second).c_str());
  }
  if (ranked.empty()) return 2;
  if (args.dry_run) return 0;
  if (const std::string& why = ranked.front().candidate->checked.data_not_checked; !why.empty())
    throw UserError("the trials need the data, which cannot be opened here (" + why + "); --dry-run ranks the candidates without it");

  // Measured trials, in predicted order.
  const fs::path out_dir = args.out_dir.empty() ? fs::path("runs/tune") : fs::path(args.out_dir);
  fs::create_directories(out_dir);
  const size_t want = args.top > 0 ? static_cast<size_t>(args.top) : kDefaultTrials;
  const int64_t rounds = args.rounds > 0 ? args.rounds : kDefaultRounds;
  TrialSettings settings;
  settings.ranks = args.ranks;
  const std::string fingerprint = machine_fingerprint() + "|" + std::to_string(args.ranks) + "|" +
                                  std::to_string(settings.warmup_steps) + "+" + std::to_string(settings.measured_steps) + "x" +
                                  std::to_string(rounds);
  auto cache = read_cache();
  const auto started = std::chrono::steady_clock::now();
  auto out_of_time = [&] { return args.budget_s > 0 && seconds_since(started) > args.budget_s; };
  auto trial = [&](Outcome& o, const std::string& run_name) {
    settings.timeout_s = std::max(120.0, 20 * o.candidate->predicted_s * static_cast<double>(settings.warmup_steps + settings.measured_steps));
    TrialResult r = run_trial(out_dir / (o.name + ".toml"), out_dir / run_name, settings);
    if (r.ok) o.samples.push_back(r.step_s);
    return r;
  };
  // A rank holds more than the model states and activations the model predicts: the allocator's
  // free lists, the trainer's own buffers, pages the data loader touched. The first trial measures
  // how much, and every prediction after it includes that (memory_calibration_bytes).
  double calibration = 0;
  bool calibrated = false;
  auto predicted_bytes = [&](const Outcome& o) { return o.candidate->predicted_bytes + calibration; };
  size_t measured = 0;
  std::printf("\nMeasuring the top %zu (%ld warm-up + %ld measured steps each, fresh processes; logs in %s):\n", want,
              static_cast<long>(settings.warmup_steps), static_cast<long>(settings.measured_steps), out_dir.c_str());
  std::printf("%5s %12s %11s %14s %12s  %-40s %s\n", "rank", "predicted s", "measured s", "predicted MiB", "measured MiB", "layout", "verdict");
  for (size_t i = 0; i < ranked.size() && measured < want; ++i) {
    if (out_of_time()) {
      std::printf("  --budget %.0f s spent: the rest are not measured\n", args.budget_s);
      break;
    }
    Outcome& o = ranked[i];
    if (budget > 0 && predicted_bytes(o) > budget) {
      o.verdict = "over --memory-gb (predicted, calibrated)";
      continue;
    }
    o.name = "candidate-" + std::to_string(i + 1);
    const std::string text = raw_strategy_toml(o.candidate->raw, "# strata tune candidate " + std::to_string(i + 1) + ": " + o.candidate->layout +
                                                                  "; " + other_choices(*o.candidate) + "\n");
    std::ofstream(out_dir / (o.name + ".toml")) << text;
    o.cache_key = hex_key(text.substr(text.find('\n') + 1) + "|" + fingerprint);
    if (auto hit = cache.find(o.cache_key); hit != cache.end() && !args.remeasure) {
      TrialResult r;
      r.ok = true, r.verdict = "ok", r.step_s = hit->second.value("step_s", 0.0), r.peak_bytes = hit->second.value("peak_bytes", 0.0);
      o.trial = r, o.cached = true;
    } else {
      o.trial = trial(o, o.name);
    }
    ++measured;
    if (o.trial->ok && !calibrated) calibration = o.trial->peak_bytes - o.candidate->predicted_bytes, calibrated = true;
    if (!o.trial->ok) o.verdict = "failed: " + o.trial->verdict;
    else if (budget > 0 && o.trial->peak_bytes > budget) o.verdict = "over --memory-gb (measured)";
    else o.verdict = o.cached ? "measured (cached)" : "measured";
    std::printf("%5zu %12.4f %11s %14s %12s  %-40s %s\n", i + 1, o.candidate->predicted_s,
                o.trial->ok ? std::to_string(o.trial->step_s).substr(0, 7).c_str() : "-", mib(predicted_bytes(o)).c_str(),
                o.trial->ok ? mib(o.trial->peak_bytes).c_str() : "-", o.candidate->layout.c_str(), o.verdict.c_str());
    std::fflush(stdout);
  }
  auto fastest = [&]() -> Outcome* {
    Outcome* best = nullptr;
    for (auto& o : ranked)
      if (o.trial && o.trial->ok && o.verdict.rfind("measured", 0) == 0 && (!best || o.trial->step_s < best->trial->step_s)) best = &o;
    return best;
  };
  // Four steps on shared cores vary by tens of percent from one process to the next, so the ones
  // within kContenderMargin of the fastest are trained again (--rounds trials in all),
  // interleaved, and compared by their median. Cached results are such medians already.
  std::vector<Outcome*> contenders;
  if (const Outcome* lead = fastest())
    for (auto& o : ranked)
      if (o.verdict == "measured" && o.trial->step_s <= kContenderMargin * lead->trial->step_s) contenders.push_back(&o);
  if (contenders.size() > 1 && rounds > 1) {
    std::printf("\nConfirming the %zu within %.0f%% of the fastest: %ld more trials each, interleaved (median of all):\n",
                contenders.size(), 100 * (kContenderMargin - 1), static_cast<long>(rounds - 1));
    for (int64_t round = 1; round < rounds && !out_of_time(); ++round)
      for (Outcome* o : contenders) {
        const TrialResult r = trial(*o, o->name + "-round" + std::to_string(round + 1));
        if (r.ok) o->trial->peak_bytes = std::max(o->trial->peak_bytes, r.peak_bytes);
      }
    for (Outcome* o : contenders) {
      o->trial->step_s = median(o->samples);
      std::string trials;
      for (double sample : o->samples) trials += (trials.empty() ? "" : ", ") + std::to_string(sample).substr(0, 7);
      std::printf("  %-40s %s: median %.4f s (%s)\n", o->candidate->layout.c_str(), other_choices(*o->candidate).c_str(), o->trial->step_s,
                  trials.c_str());
    }
  }
  for (auto& o : ranked)
    if (o.verdict == "measured") append_cache(o.cache_key, *o.trial);
  Outcome* best = fastest();
  if (best) best->verdict = best->cached ? "best (cached)" : "best";

  std::ofstream jsonl(out_dir / "tune.jsonl");
  for (size_t i = 0; i < ranked.size(); ++i) jsonl << outcome_json(ranked[i], i + 1, calibration).dump() << "\n";
  for (const auto& o : others) jsonl << outcome_json(o, 0, calibration).dump() << "\n";
  if (!best) {
    std::fprintf(stderr, "strata tune: error: none of the %zu measured candidates ran within the budget; see %s\n", measured,
                 (out_dir / "tune.jsonl").c_str());
    return 2;
  }
  const fs::path output = args.output.empty() ? out_dir / "best.toml" : fs::path(args.output);
  const size_t best_rank = static_cast<size_t>(best - ranked.data()) + 1;
  const std::string how = (best->samples.size() > 1 ? "the median of " + std::to_string(best->samples.size()) + " trials, each " : std::string()) +
                          "the median of " + std::to_string(settings.measured_steps) + " steps after " + std::to_string(settings.warmup_steps) +
                          " warm-up";
  char header[1024];
  std::snprintf(header, sizeof header,
                "# Chosen by `strata tune %s -n %ld`%s: %s; %s.\n"
                "# Measured %.4f s per step (%s) and %s MiB peak on the busiest rank;\n"
                "# predicted %.4f s and %s MiB (rank %zu of %zu by the cost model); %zu candidates measured, every one in %s.\n"
                "# Run it with: strata run %s -n %ld\n",
                args.positional[0].c_str(), static_cast<long>(args.ranks),
                args.memory_gb > 0 ? (" --memory-gb " + std::to_string(args.memory_gb).substr(0, 6)).c_str() : "", best->candidate->layout.c_str(),
                other_choices(*best->candidate).c_str(), best->trial->step_s, how.c_str(), mib(best->trial->peak_bytes).c_str(), best->candidate->predicted_s,
                mib(predicted_bytes(*best)).c_str(), best_rank, ranked.size(), measured, (out_dir / "tune.jsonl").c_str(),
                output.c_str(), static_cast<long>(args.ranks));
  std::ofstream(output) << raw_strategy_toml(best->candidate->raw, header);
  std::printf("\nBest: %s; %s: %.4f s per step measured. Written to %s (all candidates: %s)\n", best->candidate->layout.c_str(),
              other_choices(*best->candidate).c_str(), best->trial->step_s, output.c_str(), (out_dir / "tune.jsonl").c_str());
  return 0;
}

}  // namespace strata::cli
