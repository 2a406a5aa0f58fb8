// Schedule keys the chosen schedule does not read (schedule_check.h).
#include "schedule_check.h"

namespace strata {
namespace {

// Whether `key` holds other than its default (core_schemas.cpp's optimizer_common_schema).
bool differs_from_default(const Config& optimizer, const std::string& key) {
  const KeySpec* spec = optimizer_common_schema().find(key);
  return spec && spec->default_value && optimizer.has(key) && optimizer.entry(key).value != *spec->default_value;
}

}  // namespace

void check_schedule(const Config& optimizer, Diagnostics& diagnostics) {
  if (!optimizer.has("schedule")) return;
  const std::string schedule = optimizer.get_string("schedule");
  auto refuse = [&](const std::string& key, const std::string& why) {
    if (differs_from_default(optimizer, key))
      diagnostics.error(optimizer.entry(key).pos, "[optimizer] " + key + " " + why + ", and schedule is \"" + schedule + "\"");
  };
  if (schedule == "constant") refuse("min_lr_ratio", "is where a decaying schedule (cosine, linear, wsd) ends");
  if (schedule != "wsd") {
    refuse("decay_fraction", "applies to schedule = \"wsd\" only");
    refuse("decay_shape", "applies to schedule = \"wsd\" only");
  }
}

}  // namespace strata
