// One measured trial of `strata tune`: a candidate strategy trained for a few steps by
// `strata run` in fresh processes, its step time and peak memory read from its metrics.jsonl.
#pragma once

#include <filesystem>
#include <string>

namespace strata::cli {

struct TrialSettings {
  int64_t ranks = 1;
  int64_t warmup_steps = 2;    // discarded: the first steps allocate, fault pages in, warm caches
  int64_t measured_steps = 4;  // their median step time is the result
  double timeout_s = 120;      // the trial is killed after this and recorded as timed out
};

struct TrialResult {
  bool ok = false;
  double step_s = 0;      // median of the measured steps
  double peak_bytes = 0;  // the largest resident set any rank reached (metrics' mem_peak_bytes)
  double wall_s = 0;      // the whole trial, start-up and the final checkpoint included
  std::string verdict;    // "ok", or why not: "exit status 1: <its last error line>", "killed by signal 9", "timed out"
};

// Runs `strata run STRATEGY -n ranks --out RUN_DIR` (this executable) with steps, evaluation and
// checkpoints overridden for the trial; its output goes to RUN_DIR.log.
TrialResult run_trial(const std::filesystem::path& strategy, const std::filesystem::path& run_dir, const TrialSettings& settings);

}  // namespace strata::cli
