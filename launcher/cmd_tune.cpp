// strata tune: search the strategies for N ranks around the one given (strata/core/tune.h).
// This slice ranks the candidates by the analytic cost model (--dry-run); measuring them is next.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <thread>
#include <vector>

#include <unistd.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "commands.h"
#include "common.h"
#include "strata/core/tune.h"

namespace strata::cli {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// This process's resident set: libtorch and the plugins loaded, as every rank has them.
double resident_bytes() {
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

// This machine's rates as `ranks` ranks of one thread each see them: an fp32 matmul's FLOP/s on
// one thread, shared when there are more ranks than cores; and a memory copy's bytes per second
// halved (a shared-memory collective copies into and out of a shared buffer).
HardwareRates measure_rates(int64_t ranks) {
  HardwareRates rates;
  rates.process_bytes = resident_bytes();  // before the buffers below
  at::set_num_threads(1);
  const int64_t n = 256;
  const at::Tensor a = at::randn({n, n}), b = at::randn({n, n});
  at::Tensor c = at::matmul(a, b);
  auto start = std::chrono::steady_clock::now();
  int64_t rounds = 0;
  while (seconds_since(start) < 0.2) c = at::matmul(a, b), ++rounds;
  const double flops = 2.0 * n * n * n * rounds / seconds_since(start);
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  std::vector<char> from(64 << 20, 1), to(64 << 20);
  std::memcpy(to.data(), from.data(), from.size());
  start = std::chrono::steady_clock::now();
  for (int i = 0; i < 4; ++i) std::memcpy(to.data(), from.data(), from.size());
  const double copy = 4.0 * from.size() / seconds_since(start);
  rates.flops_per_s = flops * std::min(1.0, static_cast<double>(cores) / static_cast<double>(ranks));
  rates.bytes_per_s = copy / 2;
  return rates;
}

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

}  // namespace

int run_tune(const Args& args) {
  allow_only(args, {"-n", "--ranks", "--set", "--disable", "--memory-gb", "--dry-run", "--top"});
  if (args.positional.size() != 1) throw UserError("'strata tune' takes one strategy file; see strata tune --help");
  if (!args.dry_run)
    throw UserError("strata tune measures candidates in a later release; for now it ranks them with --dry-run");
  Diagnostics diagnostics;
  RawStrategy raw = load_strategy_file(args.positional[0], diagnostics);
  if (diagnostics.ok()) apply_overrides(raw, args.sets, args.disables, diagnostics);
  if (!diagnostics.ok()) {
    std::cerr << diagnostics.str();
    return 2;
  }
  ComponentRegistry registry;
  load_plugins(registry, strategy_plugin_path(raw));
  const HardwareRates rates = measure_rates(args.ranks);
  const TuneSpace space = generate_candidates(raw, registry, args.ranks, rates);
  const double budget = args.memory_gb * double(1 << 30);

  std::vector<const TuneCandidate*> ranked, over_budget;
  std::map<std::string, std::pair<size_t, const TuneCandidate*>> refused;  // reason -> count, first
  for (const auto& c : space.candidates) {
    if (!c.rejected.empty()) {
      auto& slot = refused[c.rejected];
      if (slot.first++ == 0) slot.second = &c;
    } else if (budget > 0 && c.predicted_bytes > budget) {
      over_budget.push_back(&c);
    } else {
      ranked.push_back(&c);
    }
  }
  std::printf("strata tune %s -n %ld: %zu candidates from the loaded passes' declarations%s; %zu plan, %zu refused by plan checks",
              args.positional[0].c_str(), static_cast<long>(args.ranks), space.candidates.size(),
              space.truncated ? " (truncated)" : "", ranked.size() + over_budget.size(), space.candidates.size() - ranked.size() - over_budget.size());
  if (budget > 0) std::printf(", %zu over --memory-gb %g", over_budget.size(), args.memory_gb);
  std::printf("\nrates per rank: matmul %.1f GFLOP/s, collectives %.2f GB/s (measured here, %ld ranks on %u cores)\n\n",
              rates.flops_per_s / 1e9, rates.bytes_per_s / 1e9, static_cast<long>(args.ranks),
              std::max(1u, std::thread::hardware_concurrency()));
  const size_t shown = std::min<size_t>(ranked.size(), args.top > 0 ? static_cast<size_t>(args.top) : 20);
  std::printf("%5s %12s %14s  %-40s %s\n", "rank", "predicted s", "peak MiB/rank", "layout", "other choices");
  for (size_t i = 0; i < shown; ++i)
    std::printf("%5zu %12.4f %14s  %-40s %s\n", i + 1, ranked[i]->predicted_s, mib(ranked[i]->predicted_bytes).c_str(),
                ranked[i]->layout.c_str(), other_choices(*ranked[i]).c_str());
  if (shown < ranked.size()) std::printf("  ... %zu more (--top N shows more)\n", ranked.size() - shown);
  if (ranked.empty()) std::printf("  (none)\n");
  if (!over_budget.empty()) {
    const TuneCandidate* smallest = *std::min_element(over_budget.begin(), over_budget.end(), [](auto* a, auto* b) {
      return a->predicted_bytes < b->predicted_bytes;
    });
    std::printf("\nOver the memory budget: %zu; the smallest needs %s MiB per rank: %s; %s\n", over_budget.size(),
                mib(smallest->predicted_bytes).c_str(), smallest->layout.c_str(), other_choices(*smallest).c_str());
  }
  if (!refused.empty()) {
    std::printf("\nRefused by the plan checks (count, reason, first candidate):\n");
    for (const auto& [reason, slot] : refused)
      std::printf("  %3zu  %s\n       e.g. %s; %s\n", slot.first, reason.c_str(), slot.second->layout.c_str(), other_choices(*slot.second).c_str());
  }
  return ranked.empty() ? 2 : 0;
}

}  // namespace strata::cli
