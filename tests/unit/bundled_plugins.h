// The plugins built with Strata, loaded once per test binary, and configs for their components.
#pragma once

#include <map>
#include <string>

#include "strata/core/component_registry.h"
#include "strata/core/plugin_loader.h"

namespace strata::test {

inline const ComponentRegistry& bundled() {
  static ComponentRegistry* registry = [] {
    auto* r = new ComponentRegistry();
    PluginLoader(*r).load_search_path({installed_plugin_dir()});
    return r;
  }();
  return *registry;
}

// The component's defaults with some keys replaced.
inline Config config_for(const Component& component, const std::map<std::string, Value>& values) {
  Config config;
  for (const auto& spec : component.info().schema.keys()) {
    auto it = values.find(spec.key);
    config.set(spec.key, Config::Entry{it != values.end() ? it->second : *spec.default_value, Origin::Default, {}});
  }
  return config;
}

}  // namespace strata::test
