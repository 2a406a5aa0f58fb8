// Helpers for testing a plugin against an installed Strata (target Strata::testing): load
// plugins into a registry, build configs for components, and train a small strategy in process.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "strata/core/component_registry.h"
#include "strata/core/operator_table.h"
#include "strata/core/pass_manager.h"
#include "strata/core/plugin_loader.h"
#include "strata/core/strategy.h"
#include "strata/placement.h"
#include "strata/core/trainer.h"
#include "strata/errors.h"

namespace strata::testing {

// Strata's bundled plugins, then every plugin library found in `dirs` (a directory or a file).
inline std::unique_ptr<ComponentRegistry> load_plugins(const std::vector<std::filesystem::path>& dirs) {
  auto registry = std::make_unique<ComponentRegistry>();
  std::vector<std::filesystem::path> path{installed_plugin_dir()};
  path.insert(path.end(), dirs.begin(), dirs.end());
  PluginLoader(*registry).load_search_path(path);
  return registry;
}

// The component registered under `name`, as its interface type; a UserError if it is missing.
template <class T>
const T& component(const ComponentRegistry& registry, ComponentKind kind, const std::string& name) {
  const auto* found = dynamic_cast<const T*>(registry.find(kind, name));
  if (!found) throw UserError(std::string(component_kind_name(kind)) + " '" + name + "' is not registered");
  return *found;
}

// A config for `c` holding its schema's defaults with `values` replacing some of them. Keys
// without a default (required ones) must be given.
inline Config config_for(const Component& c, const std::map<std::string, Value>& values = {}) {
  Config config;
  for (const auto& spec : c.info().schema.keys()) {
    auto it = values.find(spec.key);
    if (it == values.end() && !spec.default_value) throw UserError("config_for: required key '" + spec.key + "' not given");
    config.set(spec.key, Config::Entry{it != values.end() ? it->second : *spec.default_value, Origin::Default, {}});
  }
  for (const auto& [key, value] : values)
    if (!c.info().schema.find(key)) throw UserError("config_for: '" + c.name() + "' has no key '" + key + "'");
  return config;
}

// A strategy planned for one rank as `strata plan` plans it, with the registry it was resolved
// against (which must outlive what is built from the plan).
struct PlannedStrategy {
  std::unique_ptr<ComponentRegistry> registry;
  ResolvedStrategy plan;
  std::vector<size_t> order;  // of plan.passes
};

// Plans `strategy_toml` (the text of a strategy file) with `--set` and `--disable` overrides;
// plugins in `plugin_dirs` are loaded as with plugin_path. A plan-time error is a UserError.
inline PlannedStrategy plan_strategy(const std::string& strategy_toml, const std::vector<std::filesystem::path>& plugin_dirs = {},
                                     const StringList& sets = {}, const StringList& disables = {}) {
  Diagnostics diagnostics;
  RawStrategy raw = parse_strategy_text(strategy_toml, "<test strategy>", diagnostics);
  if (diagnostics.ok()) apply_overrides(raw, sets, disables, diagnostics);
  if (!diagnostics.ok()) throw UserError(diagnostics.str());
  PlannedStrategy out;
  out.registry = load_plugins(plugin_dirs);
  out.plan = resolve_strategy(raw, *out.registry, 1, diagnostics);
  out.order = diagnostics.ok() ? order_passes(out.plan.passes, diagnostics) : std::vector<size_t>{};
  const bool resolved = diagnostics.ok();
  check_sizes(out.plan, diagnostics);
  if (const std::string unread = resolved ? check_data(out.plan, diagnostics) : std::string(); !unread.empty()) throw UserError(unread);
  if (!diagnostics.ok()) throw UserError(diagnostics.str());
  return out;
}

// Trains `strategy_toml` in this process, as `strata run --out out_dir --set ...` would on one rank.
inline RunSummary train(const std::string& strategy_toml, const std::filesystem::path& out_dir,
                        const std::vector<std::filesystem::path>& plugin_dirs = {}, const StringList& sets = {},
                        const StringList& disables = {}) {
  const PlannedStrategy planned = plan_strategy(strategy_toml, plugin_dirs, sets, disables);
  return run_training(planned.plan, planned.order, *planned.registry, RunOptions{out_dir, false});
}

// The piece of `whole` that `placement` names: its block (a placement without a flat offset).
// Tests compare a split model's tensors with the whole model's.
inline at::Tensor piece_of(const at::Tensor& whole, const Placement& placement) {
  return placement.has_block() ? strata::piece_of(whole, placement, placement.block_size) : whole;
}

}  // namespace strata::testing
