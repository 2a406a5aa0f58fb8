// A plugin that includes one of core's own headers. It must not compile: a plugin sees only the
// plugin ABI (plugin_api/include), so nothing outside the versioned contract can creep into a
// plugin (test plugin.cannot_include_core, docs/plugin-abi.md).
#include "strata/core/trainer.h"
#include "strata/plugin.h"

namespace {
void register_components(strata::Registry&) {}
}  // namespace

STRATA_PLUGIN("reaches_core", "0.0.1", register_components)
