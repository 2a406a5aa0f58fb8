// Reading a strategy from the command line the same way for every command that takes one.
#pragma once

#include <vector>

#include "cli_args.h"
#include "strata/core/component_registry.h"
#include "strata/core/strategy.h"
#include "strata/core/tune.h"

namespace strata::cli {

// The plan and its pass order after every check `strata plan` runs (strata/core/tune.h).
using LoadedPlan = CheckedPlan;

// Parses args.positional[0], applies --set/--disable, loads plugins into `registry` and resolves
// for `world_size`. Returns false after printing every error to stderr.
bool load_plan(const Args& args, int64_t world_size, ComponentRegistry& registry, LoadedPlan& out);

}  // namespace strata::cli
