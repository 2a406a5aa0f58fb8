// Makes the loaded plugins' pipeline schedules findable through strata::pipeline::find_schedule.
#pragma once

#include "strata/core/component_registry.h"

namespace strata::pipeline {

// Called once the plugins are loaded (by `strata run` and `strata plan`); `registry` must
// outlive every later find_schedule.
STRATA_API void install_schedules(const ComponentRegistry& registry);

}  // namespace strata::pipeline
