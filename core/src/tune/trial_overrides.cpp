// What a trial overrides in a candidate's strategy (strata/core/tune_trials.h).
#include "strata/core/strategy.h"
#include "strata/core/tune_trials.h"

namespace strata {

std::vector<std::string> trial_overrides(int64_t steps) {
  std::vector<std::string> sets{"job.steps=" + std::to_string(steps), "job.eval_every=0",   "job.checkpoint_every=0",
                                "job.checkpoint_at_end=false",         "job.flash_every=0", "job.max_restarts=0",
                                "job.log_every=1000",                  "job.profile_steps=0"};
  for (const char* key : {"eval_batches", "keep_checkpoints", "snapshot_replicas", "restart_backoff", "min_ranks"})
    sets.push_back(std::string("job.") + key + "=" + value_to_toml(*job_schema().find(key)->default_value));
  return sets;
}

}  // namespace strata
