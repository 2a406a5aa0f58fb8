// Keys that another key's setting leaves unread (unread_keys.h).
#include "unread_keys.h"

namespace strata {
namespace {

// Whether `key` of `section` holds other than `schema`'s default.
bool differs_from_default(const Config& section, const Schema& schema, const std::string& key) {
  const KeySpec* spec = schema.find(key);
  return spec && spec->default_value && section.has(key) && section.entry(key).value != *spec->default_value;
}

void check_schedule(const Config& optimizer, Diagnostics& diagnostics) {
  if (!optimizer.has("schedule")) return;
  const std::string schedule = optimizer.get_string("schedule");
  auto refuse = [&](const std::string& key, const std::string& why) {
    if (differs_from_default(optimizer, optimizer_common_schema(), key))
      diagnostics.error(optimizer.entry(key).pos, "[optimizer] " + key + " " + why + ", and schedule is \"" + schedule + "\"");
  };
  if (schedule == "constant") refuse("min_lr_ratio", "is where a decaying schedule (cosine, linear, wsd) ends");
  if (schedule != "wsd") {
    refuse("decay_fraction", "applies to schedule = \"wsd\" only");
    refuse("decay_shape", "applies to schedule = \"wsd\" only");
  }
}

void check_job(const Config& job, Diagnostics& diagnostics) {
  auto refuse = [&](const std::string& key, const std::string& why) {
    if (differs_from_default(job, job_schema(), key))
      diagnostics.error(job.entry(key).pos, "[job] " + key + " = " + value_to_toml(job.entry(key).value) + " " + why);
  };
  if (job.get_int("eval_every") == 0) refuse("eval_batches", "sizes each evaluation, and eval_every = 0 runs none; set eval_every");
  if (job.get_int("checkpoint_every") == 0 && !job.get_bool("checkpoint_at_end") && job.get_int("flash_every") == 0)
    refuse("keep_checkpoints", "limits the checkpoints kept, and none is taken (checkpoint_every = 0, checkpoint_at_end = false, "
                               "flash_every = 0)");
  if (job.get_int("flash_every") == 0)
    refuse("snapshot_replicas", "replicates flash snapshots, and flash_every = 0 takes none; set flash_every");
  if (job.get_int("max_restarts") == 0) {
    refuse("restart_backoff", "spaces restarts, and max_restarts = 0 allows none");
    const std::string health = job.get_string("health_check");
    if (health != "exclude" && health != "exclude_stragglers")
      refuse("min_ranks", "bounds the ranks a restart or the health check's exclusion may leave, and max_restarts = 0 and health_check = \"" +
                              health + "\" do neither");
  }
}

}  // namespace

void check_unread_keys(const ResolvedStrategy& plan, Diagnostics& diagnostics) {
  check_schedule(plan.optimizer, diagnostics);
  if (plan.job.has("eval_every")) check_job(plan.job, diagnostics);
}

}  // namespace strata
