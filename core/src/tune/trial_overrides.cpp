// What a trial overrides in a candidate's strategy (strata/core/tune_trials.h).
#include "strata/core/tune_trials.h"

namespace strata {

std::vector<std::string> trial_overrides(int64_t steps) {
  return {"job.steps=" + std::to_string(steps), "job.eval_every=0",  "job.checkpoint_every=0", "job.checkpoint_at_end=false",
          "job.flash_every=0",                   "job.max_restarts=0", "job.log_every=1000",     "job.profile_steps=0"};
}

}  // namespace strata
