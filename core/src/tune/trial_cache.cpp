// TrialCache (strata/core/tune_trials.h): what earlier tunes measured on this machine. A key names
// the machine (CPU model, cores, Strata and libtorch versions) with what was measured, so a new
// Strata, another machine or other trial settings never read an old figure.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "strata/core/cpu_features.h"
#include "strata/core/tune_trials.h"
#include "strata/core/version.h"

namespace strata {
namespace {

std::string machine_fingerprint() {
  const VersionInfo v = version_info();
  // The leading space: keys written before the model came from cpu_features() had it.
  return " " + cpu_features().model + "|" + std::to_string(std::thread::hardware_concurrency()) + "|" + v.strata + "|" + v.torch;
}

std::string hex_key(const std::string& text) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016zx", std::hash<std::string>{}(text));
  return buf;
}

std::string rates_key(int64_t ranks) { return "rates|" + machine_fingerprint() + "|" + std::to_string(ranks); }

}  // namespace

std::filesystem::path TrialCache::file() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::filesystem::path base = xdg && *xdg ? std::filesystem::path(xdg) : std::filesystem::path(home ? home : ".") / ".cache";
  return base / "strata" / "tune_cache.jsonl";
}

TrialCache::TrialCache() {
  std::ifstream in(file());
  for (std::string line; std::getline(in, line);) {
    const auto record = nlohmann::json::parse(line, nullptr, false);
    if (!record.is_discarded() && record.contains("key")) records_.emplace_back(record["key"].get<std::string>(), line);
  }
}

std::string TrialCache::key(const TuneCandidate& candidate, int64_t ranks, const TrialRunner& runner, int64_t rounds) const {
  return hex_key(raw_strategy_toml(candidate.raw, "") + "|" + machine_fingerprint() + "|" + std::to_string(ranks) + "|" +
                 std::to_string(runner.warmup_steps()) + "+" + std::to_string(runner.measured_steps()) + "x" + std::to_string(rounds));
}

std::optional<TrialResult> TrialCache::find(const std::string& key) const {
  for (auto it = records_.rbegin(); it != records_.rend(); ++it)
    if (it->first == key) {
      const auto j = nlohmann::json::parse(it->second);
      TrialResult r;
      r.ok = true, r.verdict = "ok", r.step_s = j.value("step_s", 0.0), r.peak_bytes = j.value("peak_bytes", 0.0);
      return r;
    }
  return std::nullopt;
}

void TrialCache::add(const std::string& key, const TrialResult& r) {
  append(nlohmann::json{{"key", key}, {"step_s", r.step_s}, {"peak_bytes", r.peak_bytes}}.dump());
}

std::optional<HardwareRates> TrialCache::rates(int64_t ranks) const {
  const std::string key = rates_key(ranks);
  for (auto it = records_.rbegin(); it != records_.rend(); ++it)
    if (it->first == key) {
      const auto j = nlohmann::json::parse(it->second);
      HardwareRates r;
      r.flops_per_s = j.value("flops_per_s", r.flops_per_s), r.oversubscription = j.value("oversubscription", r.oversubscription);
      r.bytes_per_s = j.value("bytes_per_s", r.bytes_per_s), r.message_latency_s = j.value("message_latency_s", r.message_latency_s);
      r.layer_overhead_s = j.value("layer_overhead_s", r.layer_overhead_s), r.parameter_pass_s = j.value("parameter_pass_s", r.parameter_pass_s);
      r.process_bytes = j.value("process_bytes", r.process_bytes);
      return r;
    }
  return std::nullopt;
}

void TrialCache::add_rates(int64_t ranks, const HardwareRates& r) {
  append(nlohmann::json{{"key", rates_key(ranks)}, {"flops_per_s", r.flops_per_s}, {"oversubscription", r.oversubscription},
                        {"bytes_per_s", r.bytes_per_s}, {"message_latency_s", r.message_latency_s},
                        {"layer_overhead_s", r.layer_overhead_s}, {"parameter_pass_s", r.parameter_pass_s},
                        {"process_bytes", r.process_bytes}}.dump());
}

void TrialCache::append(const std::string& line) {
  std::error_code ec;
  std::filesystem::create_directories(file().parent_path(), ec);
  std::ofstream(file(), std::ios::app) << line << "\n";
  records_.emplace_back(nlohmann::json::parse(line)["key"].get<std::string>(), line);
}

}  // namespace strata
