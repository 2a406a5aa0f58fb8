// Reading a strategy from the command line the same way for every command that takes one.
#pragma once

#include <vector>

#include "cli_args.h"
#include "strata/core/component_registry.h"
#include "strata/core/strategy.h"

namespace strata::cli {

struct LoadedPlan {
  ResolvedStrategy plan;
  std::vector<size_t> order;
  std::string data_not_checked;  // why check_sizes could not open the data, if it could not
};

// Parses args.positional[0], applies --set/--disable, loads plugins into `registry` and resolves
// for `world_size`. Returns false after printing every error to stderr.
bool load_plan(const Args& args, int64_t world_size, ComponentRegistry& registry, LoadedPlan& out);

}  // namespace strata::cli
