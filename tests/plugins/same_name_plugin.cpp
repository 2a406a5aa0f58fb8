// A different file claiming the plugin name "good".
#include "strata/plugin.h"

namespace {
void register_components(strata::Registry&) {}
}  // namespace

STRATA_PLUGIN("good", "9.9.9", register_components)
