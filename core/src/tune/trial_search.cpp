// The trials of a tune (strata/core/tune_trials.h): the cost model's order, measured.
//
// Predictions rank; measurements decide. The planned candidates within the memory budget are
// trained in predicted order until `trials` ran (or the time budget is spent), each prediction
// after the first trial corrected by what that trial measured above the model's memory figure.
// A few steps on shared cores vary by tens of percent from one process to the next, so the
// candidates measured within `contender_margin` of the fastest are trained again, `rounds`
// trials in all, interleaved (round 2 of every contender, then round 3, ...) so that a slow
// minute of the machine falls on all of them, and compared by their median. Cached results are
// such medians already.
#include <algorithm>
#include <chrono>

#include "strata/core/statistics.h"
#include "strata/core/tune_trials.h"

namespace strata {
namespace {

bool measured_fresh(const TrialOutcome& o) { return o.verdict == "measured"; }

std::optional<size_t> fastest(const TrialSearch& search) {
  std::optional<size_t> best;
  for (size_t i = 0; i < search.ranked.size(); ++i) {
    const TrialOutcome& o = search.ranked[i];
    if (o.trial && o.trial->ok && o.verdict.rfind("measured", 0) == 0 && (!best || o.trial->step_s < search.ranked[*best].trial->step_s))
      best = i;
  }
  return best;
}

// The first trial of `o`, from the cache when it holds one.
void first_trial(TrialSearch& search, TrialOutcome& o, TrialRunner& runner, const TrialSettings& s) {
  if (s.cache) {
    o.cache_key = s.cache->key(*o.candidate, s.ranks, runner, s.rounds);
    if (auto hit = s.reuse_cached ? s.cache->find(o.cache_key) : std::nullopt) o.trial = *hit, o.cached = true;
  }
  if (!o.cached) {
    o.trial = runner.run(*o.candidate, o.rank, 1);
    if (o.trial->ok) o.samples.push_back(o.trial->step_s);
  }
  ++search.measured;
  if (o.trial->ok && o.trial->peak_bytes > 0 && !search.calibrated)
    search.calibration = o.trial->peak_bytes - o.candidate->predicted_bytes, search.calibrated = true;
  const double budget = s.memory_budget_bytes;
  if (!o.trial->ok) o.verdict = "failed: " + o.trial->verdict;
  else if (budget > 0 && o.trial->peak_bytes > budget) o.verdict = "over --memory-gb (measured)";
  else o.verdict = o.cached ? "measured (cached)" : "measured";
}

void confirm_contenders(TrialSearch& search, TrialRunner& runner, const TrialSettings& s, const std::function<bool()>& out_of_time) {
  const std::optional<size_t> lead = fastest(search);
  if (!lead || s.rounds <= 1) return;
  const double lead_s = search.ranked[*lead].trial->step_s;
  std::vector<TrialOutcome*> contenders;
  for (auto& o : search.ranked)
    if (measured_fresh(o) && o.trial->step_s <= s.contender_margin * lead_s) contenders.push_back(&o);
  if (contenders.size() < 2) return;
  if (s.confirming) s.confirming(std::vector<const TrialOutcome*>(contenders.begin(), contenders.end()));
  for (int64_t round = 2; round <= s.rounds && !out_of_time(); ++round)
    for (TrialOutcome* o : contenders) {
      const TrialResult r = runner.run(*o->candidate, o->rank, round);
      if (!r.ok) continue;
      o->samples.push_back(r.step_s);
      o->trial->peak_bytes = std::max(o->trial->peak_bytes, r.peak_bytes);
    }
  for (TrialOutcome* o : contenders) {
    o->trial->step_s = median(o->samples);
    if (s.confirmed) s.confirmed(*o);
  }
}

}  // namespace

TrialSearch sort_candidates(const TuneSpace& space, double memory_budget_bytes) {
  TrialSearch search;
  for (const auto& c : space.candidates) {
    if (!c.rejected.empty())
      search.others.push_back({&c, 0, "refused: " + c.rejected});
    else if (memory_budget_bytes > 0 && c.predicted_bytes > memory_budget_bytes)
      search.others.push_back({&c, 0, "over --memory-gb (predicted)"});
    else
      search.ranked.push_back({&c, search.ranked.size() + 1, "not measured"});
  }
  return search;
}

void measure_candidates(TrialSearch& search, TrialRunner& runner, const TrialSettings& s) {
  const auto started = std::chrono::steady_clock::now();
  const std::function<bool()> out_of_time = [&] { return s.time_budget_s > 0 && seconds_since(started) > s.time_budget_s; };
  for (TrialOutcome& o : search.ranked) {
    if (search.measured >= s.trials) break;
    if (out_of_time()) {
      if (s.out_of_time) s.out_of_time();
      break;
    }
    if (s.memory_budget_bytes > 0 && search.predicted_bytes(o) > s.memory_budget_bytes) {
      o.verdict = "over --memory-gb (predicted, calibrated)";
      continue;
    }
    first_trial(search, o, runner, s);
    if (s.measured) s.measured(o);
  }
  confirm_contenders(search, runner, s, out_of_time);
  if (s.cache)
    for (const auto& o : search.ranked)
      if (measured_fresh(o)) s.cache->add(o.cache_key, *o.trial);
  search.best = fastest(search);
  if (search.best) search.ranked[*search.best].verdict = search.ranked[*search.best].cached ? "best (cached)" : "best";
}

}  // namespace strata
