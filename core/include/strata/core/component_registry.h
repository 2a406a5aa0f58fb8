// The host's registry: every component of every loaded plugin, and which plugin owns it.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "strata/component.h"
#include "strata/pass.h"
#include "strata/registry.h"

namespace strata {

struct PluginRecord {
  std::string name;
  std::string version;
  std::string path;  // the file it was loaded from, or "<builtin>" for components core registers
  std::string torch_version;
  std::vector<const Component*> components;  // in registration order
  std::string abi;  // the plugin ABI it was built for, "M.m" (this host's for core's own)
};

class STRATA_API ComponentRegistry final : public Registry {
 public:
  ComponentRegistry();
  ~ComponentRegistry() override;

  // Used by plugins from inside register_plugin() only.
  void add(std::unique_ptr<Component> component) override;

  // Runs a plugin's register function. All of its components are added, or none: on any error
  // (a duplicate name, an exception from the plugin) the registry is left as it was.
  void register_plugin(PluginRecord record, void (*register_fn)(Registry&));
  // Adds components a program built itself (the library API's model, dataset or optimizer) as
  // the plugin `record`, with the same checks and the same all-or-nothing rule.
  void register_components(PluginRecord record, std::vector<std::unique_ptr<Component>> components);

  const Component* find(ComponentKind kind, const std::string& name) const;
  const Pass* find_pass(const std::string& name) const;
  std::vector<const Component*> components(ComponentKind kind) const;  // sorted by name
  std::vector<std::string> names(ComponentKind kind) const;            // sorted
  const std::vector<PluginRecord>& plugins() const { return plugins_; }
  const PluginRecord* plugin_of(const Component* component) const;
  const PluginRecord* find_plugin(const std::string& name) const;

 private:
  using Key = std::pair<ComponentKind, std::string>;
  std::map<Key, std::unique_ptr<Component>> components_;
  std::map<const Component*, size_t> owner_;  // index into plugins_
  std::vector<PluginRecord> plugins_;
  std::vector<std::unique_ptr<Component>>* pending_ = nullptr;  // set while a plugin registers
};

// "did you mean 'x'?" for a misspelt name, or "" when nothing is close.
STRATA_API std::string did_you_mean(const std::string& wrong, const std::vector<std::string>& candidates);

}  // namespace strata
