// The measured half of tuning, shared by `strata tune` and Strategy::automatic: the candidates the
// cost model ranked (strata/core/tune.h) are trained for a few steps each, in predicted order,
// until enough are measured; those within a margin of the fastest are trained again, interleaved,
// and compared by their median; the fastest that ran wins.
//
// What differs between the two callers is only how one trial runs, a TrialRunner: `strata tune`
// starts `strata run` in fresh processes (ProcessTrialRunner, so a trial that runs out of memory
// or hangs costs nothing but its time), Strategy::automatic trains in its own process (the model
// lives in the user's program; InProcessTrialRunner). Results are cached by the candidate's
// strategy text, rank count and machine (TrialCache), so tuning the same strategy again does not
// train again.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "strata/core/trainer.h"
#include "strata/core/tune.h"

namespace strata {

struct TrialResult {
  bool ok = false;
  double step_s = 0;      // median of the measured steps
  double peak_bytes = 0;  // the largest resident set any rank reached; 0 when not measured
  double wall_s = 0;      // the whole trial, start-up included
  std::string verdict;    // "ok", or why not: "exit status 1: <its last error line>", "killed by signal 9", "timed out"
};

// The `section.key=value` overrides every trial runs with, one list for both runners: `steps`
// steps, no evaluation, no checkpoint or flash snapshot, no restart, no console line, no profile.
// Each switch is stated off, so the keys they leave unread (a strategy's snapshot_replicas, say)
// wait unread instead of being refused (unread_keys.h).
STRATA_API std::vector<std::string> trial_overrides(int64_t steps);

// Trains one candidate for a few steps. `rank` is the candidate's place in the predicted order
// (from 1), `round` its trial (from 1); both name the trial's run directory.
class STRATA_API TrialRunner {
 public:
  virtual ~TrialRunner() = default;
  virtual TrialResult run(const TuneCandidate& candidate, size_t rank, int64_t round) = 0;
  virtual int64_t warmup_steps() const = 0;    // discarded: the first steps allocate, fault pages in
  virtual int64_t measured_steps() const = 0;  // their median step time is the result
};

// `strata run STRATEGY -n ranks --out DIR/candidate-K` started from `strata_executable`, steps,
// evaluation and checkpoints overridden for the trial; the candidate's strategy is written to
// DIR/candidate-K.toml and the run's output to DIR/candidate-K.log. `strata tune --trial-steps W+M`
// chooses the steps (2 warm-up and 4 measured by default; 1+1 when only the peak memory matters).
class STRATA_API ProcessTrialRunner : public TrialRunner {
 public:
  ProcessTrialRunner(std::filesystem::path strata_executable, std::filesystem::path out_dir, int64_t ranks, int64_t warmup_steps = 2,
                     int64_t measured_steps = 4);
  TrialResult run(const TuneCandidate& candidate, size_t rank, int64_t round) override;
  int64_t warmup_steps() const override { return warmup_steps_; }
  int64_t measured_steps() const override { return measured_steps_; }

 private:
  std::filesystem::path strata_executable_, out_dir_;
  int64_t ranks_, warmup_steps_, measured_steps_;
};

// A fresh Trainer in this process, in DIR/candidate_K; rank 0's median step time is broadcast so
// every rank decides alike. A trainer that refuses to start is a failed trial; running out of
// memory is not caught (the memory budget is applied before).
class STRATA_API InProcessTrialRunner : public TrialRunner {
 public:
  InProcessTrialRunner(const ComponentRegistry& registry, RunOptions run, std::filesystem::path out_dir);
  TrialResult run(const TuneCandidate& candidate, size_t rank, int64_t round) override;
  int64_t warmup_steps() const override { return 2; }
  int64_t measured_steps() const override { return 3; }

 private:
  const ComponentRegistry& registry_;
  RunOptions run_;
  std::filesystem::path out_dir_;
};

// Measured trials and machine rates by machine: $XDG_CACHE_HOME/strata/tune_cache.jsonl, one JSON
// record a line, the latest record of a key winning.
class STRATA_API TrialCache {
 public:
  TrialCache();
  // A candidate's key: its strategy text, the rank count, the trial's steps and rounds, the machine.
  std::string key(const TuneCandidate& candidate, int64_t ranks, const TrialRunner& runner, int64_t rounds) const;
  std::optional<TrialResult> find(const std::string& key) const;
  void add(const std::string& key, const TrialResult& result);
  // The machine's rates for `ranks`: measured afresh they vary by 10-60% on a shared machine,
  // which reorders near ties, so a second tune would measure candidates the first did not.
  std::optional<HardwareRates> rates(int64_t ranks) const;
  void add_rates(int64_t ranks, const HardwareRates& rates);
  static std::filesystem::path file();

 private:
  void append(const std::string& line);
  std::vector<std::pair<std::string, std::string>> records_;  // key, JSON text
};

// One candidate's fate in a tune: its record in tune.jsonl.
struct TrialOutcome {
  const TuneCandidate* candidate = nullptr;
  size_t rank = 0;       // place in the predicted order among those within the budget, from 1; 0 for the others
  std::string verdict;   // "refused: ...", "over --memory-gb (predicted)", "not measured", "measured", "best", ...
  std::optional<TrialResult> trial;  // step_s: the median of `samples` once confirmed
  bool cached = false;
  std::string cache_key;
  std::vector<double> samples;       // step_s of each trial of it, in order
};

struct TrialSettings {
  size_t trials = 6;               // candidates measured, in predicted order
  int64_t rounds = 3;              // trials of each contender, the first included
  double contender_margin = 1.25;  // measured within this of the fastest: measured again
  double memory_budget_bytes = 0;  // per rank; 0: none
  double time_budget_s = 0;        // the rest are not measured once spent; 0: none
  TrialCache* cache = nullptr;     // nullptr: every trial runs and none is kept
  bool reuse_cached = true;        // false: every trial runs, and the cache keeps the new figures
  int64_t ranks = 1;               // part of the cache key
  // Told as the search goes, for a caller that prints.
  std::function<void(const TrialOutcome&)> measured;
  std::function<void(const std::vector<const TrialOutcome*>&)> confirming;
  std::function<void(const TrialOutcome&)> confirmed;
  std::function<void()> out_of_time;
};

struct TrialSearch {
  std::vector<TrialOutcome> ranked;  // planned and within the memory budget, in predicted order
  std::vector<TrialOutcome> others;  // refused by the plan checks or over the budget
  size_t measured = 0;
  // What the first trial measured above the model's memory prediction: a rank also holds the
  // allocator's free lists, the trainer's buffers, pages the data loader touched; every prediction
  // after it includes this.
  double calibration = 0;
  bool calibrated = false;  // by the first trial that ran and measured its memory
  std::optional<size_t> best;  // index into ranked

  double predicted_bytes(const TrialOutcome& o) const { return o.candidate->predicted_bytes + calibration; }
};

// The candidates of `space` sorted into those to measure and the others (nothing measured yet).
STRATA_API TrialSearch sort_candidates(const TuneSpace& space, double memory_budget_bytes);
// Measures `search.ranked` as above and sets `best` (none when no trial ran).
STRATA_API void measure_candidates(TrialSearch& search, TrialRunner& runner, const TrialSettings& settings);

}  // namespace strata
