// The plugins built with Strata, loaded once per test binary; configs come from strata/testing.h.
#pragma once

#include <map>
#include <string>

#include "strata/core/component_registry.h"
#include "strata/core/plugin_loader.h"
#include "strata/testing.h"

namespace strata::test {

inline const ComponentRegistry& bundled() {
  static ComponentRegistry* registry = [] {
    auto* r = new ComponentRegistry();
    PluginLoader(*r).load_search_path({installed_plugin_dir()});
    return r;
  }();
  return *registry;
}

using testing::config_for;

}  // namespace strata::test
