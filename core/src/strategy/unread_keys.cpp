// Keys stated for a feature that is off (unread_keys.h).
#include "unread_keys.h"

namespace strata {
namespace {

// Whether `key` of `section` holds other than `schema`'s default.
bool differs_from_default(const Config& section, const Schema& schema, const std::string& key) {
  const KeySpec* spec = schema.find(key);
  return spec && spec->default_value && section.has(key) && section.entry(key).value != *spec->default_value;
}

bool left_out(const Config& section, const std::string& key) { return !section.has(key) || section.entry(key).origin == Origin::Default; }

// One section's keys that only a switched-on feature reads.
class SectionCheck {
 public:
  SectionCheck(std::string name, const Config& section, const Schema& schema, Diagnostics& diagnostics, std::vector<std::string>& notes)
      : name_(std::move(name)), section_(section), schema_(schema), diagnostics_(diagnostics), notes_(notes) {}

  // `key`, which only the feature that `switches` turn on reads, while that feature is off as
  // `off_state` says: refused with `refusal` where every switch was left out, else a note.
  void key_of_feature_off(const std::string& key, std::initializer_list<const char*> switches, const std::string& off_state,
                          const std::string& refusal) {
    if (!differs_from_default(section_, schema_, key)) return;
    const std::string stated = "[" + name_ + "] " + key + " = " + value_to_toml(section_.entry(key).value);
    for (const char* s : switches)
      if (!left_out(section_, s)) {
        notes_.push_back(stated + " is not read: " + off_state);
        return;
      }
    diagnostics_.error(section_.entry(key).pos, stated + " " + refusal);
  }

 private:
  std::string name_;
  const Config& section_;
  const Schema& schema_;
  Diagnostics& diagnostics_;
  std::vector<std::string>& notes_;
};

void check_optimizer(const Config& optimizer, Diagnostics& diagnostics, std::vector<std::string>& notes) {
  SectionCheck check("optimizer", optimizer, optimizer_common_schema(), diagnostics, notes);
  const std::string schedule = optimizer.get_string("schedule");
  const std::string state = "schedule = \"" + schedule + "\"";
  if (schedule != "wsd")
    for (const char* key : {"decay_fraction", "decay_shape"})
      check.key_of_feature_off(key, {"schedule"}, state, "applies to schedule = \"wsd\", and schedule is left at \"" + schedule + "\"; set schedule = \"wsd\"");
  if (schedule == "constant") check.key_of_feature_off("min_lr_ratio", {"schedule"}, state, "");  // "constant" is never a default
}

void check_job(const Config& job, Diagnostics& diagnostics, std::vector<std::string>& notes) {
  SectionCheck check("job", job, job_schema(), diagnostics, notes);
  // Profiling starts after two warm-up steps: a run of fewer than three steps never reaches it.
  if (job.get_int("profile_steps") > 0 && job.get_int("steps") < 3)
    diagnostics.error(job.entry("profile_steps").pos, "[job] profile_steps = " + std::to_string(job.get_int("profile_steps")) +
                                                          " times the steps after 2 warm-up steps, and steps = " +
                                                          std::to_string(job.get_int("steps")) + " leaves none; raise steps to 3 or more");
  if (job.get_int("eval_every") == 0)
    check.key_of_feature_off("eval_batches", {"eval_every"}, "eval_every = 0 runs no evaluation",
                             "sizes each evaluation, and eval_every is left at 0, which runs none; set eval_every");
  if (job.get_int("flash_every") == 0)
    check.key_of_feature_off("snapshot_replicas", {"flash_every"}, "flash_every = 0 takes no flash snapshot",
                             "replicates flash snapshots, and flash_every is left at 0, which takes none; set flash_every");
  if (job.get_int("max_restarts") == 0) {
    check.key_of_feature_off("restart_backoff", {"max_restarts"}, "max_restarts = 0 allows no restart",
                             "spaces restarts, and max_restarts is left at 0, which allows none; set max_restarts");
    if (job.get_string("health_check") == "off")
      check.key_of_feature_off("min_ranks", {"max_restarts", "health_check"}, "max_restarts = 0 and health_check = \"off\" leave no rank out",
                               "bounds the ranks a restart or the health check's exclusion may leave, and max_restarts and health_check "
                               "are left at 0 and \"off\"; set either");
  }
}

// Core reads these two keys of every dataset that declares them (Job::split_batch): a document
// end no token can be, and position resets without one, would change nothing.
void check_packing(const Config& data, const Config& model, Diagnostics& diagnostics) {
  if (!data.has("document_end") || !data.has("reset_positions")) return;
  const int64_t end = data.get_int("document_end");
  if (data.get_bool("reset_positions") && end < 0)
    diagnostics.error(data.entry("reset_positions").pos,
                      "[data] reset_positions = true restarts positions at each document, and document_end is -1 (the stream is "
                      "one document); set document_end to the token that ends each document");
  if (end >= 0 && model.has("vocab_size") && end >= model.get_int("vocab_size"))
    diagnostics.error(data.entry("document_end").pos, "[data] document_end = " + std::to_string(end) + " is no token of the model's "
                                                          "vocabulary (vocab_size " + std::to_string(model.get_int("vocab_size")) +
                                                          "), so no document would end; set it to a token id below that");
}

}  // namespace

void check_unread_keys(const ResolvedStrategy& plan, Diagnostics& diagnostics, std::vector<std::string>& notes) {
  // (A section that did not resolve, an unknown optimizer's, has no keys: its error is reported.)
  if (plan.optimizer.has("schedule")) check_optimizer(plan.optimizer, diagnostics, notes);
  if (plan.job.has("eval_every")) check_job(plan.job, diagnostics, notes);
  check_packing(plan.data, plan.model, diagnostics);
}

}  // namespace strata
