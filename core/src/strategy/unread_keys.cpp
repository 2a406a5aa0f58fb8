// Keys stated for a feature whose switch the strategy left out (unread_keys.h).
#include "unread_keys.h"

namespace strata {
namespace {

// Whether `key` of `section` holds other than `schema`'s default.
bool differs_from_default(const Config& section, const Schema& schema, const std::string& key) {
  const KeySpec* spec = schema.find(key);
  return spec && spec->default_value && section.has(key) && section.entry(key).value != *spec->default_value;
}

bool left_out(const Config& section, const std::string& key) { return !section.has(key) || section.entry(key).origin == Origin::Default; }

void check_schedule(const Config& optimizer, Diagnostics& diagnostics) {
  if (!left_out(optimizer, "schedule")) return;
  for (const char* key : {"decay_fraction", "decay_shape"})
    if (differs_from_default(optimizer, optimizer_common_schema(), key))
      diagnostics.error(optimizer.entry(key).pos, std::string("[optimizer] ") + key + " applies to schedule = \"wsd\", and schedule is left at \"" +
                                                      optimizer.get_string("schedule") + "\"; set schedule = \"wsd\"");
}

void check_job(const Config& job, Diagnostics& diagnostics) {
  // refuse KEY if it is stated and every one of SWITCHES is left out with the feature off
  auto refuse = [&](const std::string& key, std::initializer_list<const char*> switches, const std::string& why) {
    for (const char* s : switches)
      if (!left_out(job, s)) return;
    if (differs_from_default(job, job_schema(), key))
      diagnostics.error(job.entry(key).pos, "[job] " + key + " = " + value_to_toml(job.entry(key).value) + " " + why);
  };
  if (job.get_int("eval_every") == 0)
    refuse("eval_batches", {"eval_every"}, "sizes each evaluation, and eval_every is left at 0, which runs none; set eval_every");
  if (job.get_int("flash_every") == 0)
    refuse("snapshot_replicas", {"flash_every"}, "replicates flash snapshots, and flash_every is left at 0, which takes none; set flash_every");
  if (job.get_int("max_restarts") == 0) {
    refuse("restart_backoff", {"max_restarts"}, "spaces restarts, and max_restarts is left at 0, which allows none; set max_restarts");
    refuse("min_ranks", {"max_restarts", "health_check"},
           "bounds the ranks a restart or the health check's exclusion may leave, and max_restarts and health_check are left "
           "at 0 and \"off\"; set either");
  }
}

}  // namespace

void check_unread_keys(const ResolvedStrategy& plan, Diagnostics& diagnostics) {
  check_schedule(plan.optimizer, diagnostics);
  if (plan.job.has("eval_every")) check_job(plan.job, diagnostics);
}

}  // namespace strata
