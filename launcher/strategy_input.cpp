#include "strategy_input.h"

#include <iostream>

#include "common.h"
#include "strata/core/operator_table.h"
#include "strata/core/tune.h"
#include "strata/errors.h"

namespace strata::cli {

bool load_plan(const Args& args, int64_t world_size, ComponentRegistry& registry, LoadedPlan& out) {
  if (args.positional.size() != 1)
    throw UserError("'strata " + args.command + "' takes one strategy file; see strata " + args.command + " --help");
  Diagnostics diagnostics;
  RawStrategy raw = load_strategy_file(args.positional[0], diagnostics);
  if (diagnostics.ok()) {
    apply_overrides(raw, args.sets, args.disables, diagnostics);
    load_plugins(registry, strategy_plugin_path(raw));
    // Plan-time checks of operator choices (module_replace) read the operator table.
    OperatorTable::global().install(registry);
    check_plan(raw, registry, world_size, out, diagnostics);
  }
  if (diagnostics.ok()) return true;
  std::cerr << diagnostics.str();
  return false;
}

}  // namespace strata::cli
