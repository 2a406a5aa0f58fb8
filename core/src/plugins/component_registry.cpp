#include "strata/core/component_registry.h"

#include <algorithm>
#include <set>

#include "strata/comm.h"
#include "strata/data.h"
#include "strata/errors.h"
#include "strata/model.h"
#include "strata/ops.h"
#include "strata/optimizer.h"
#include "strata/pipeline.h"

namespace strata {

ComponentRegistry::ComponentRegistry() = default;
ComponentRegistry::~ComponentRegistry() = default;

void ComponentRegistry::add(std::unique_ptr<Component> component) {
  if (!pending_) throw std::logic_error("components can only be added while a plugin registers");
  if (!component) throw std::invalid_argument("null component");
  pending_->push_back(std::move(component));
}

namespace {

std::string describe(const PluginRecord& plugin) { return "plugin '" + plugin.name + "' (" + plugin.path + ")"; }

std::string component_label(const Component& c) {
  return std::string(component_kind_name(c.kind())) + " '" + c.name() + "'";
}

bool valid_name(const std::string& name) {
  if (name.empty()) return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-'; });
}

// Catches mistakes in a component's declaration that would otherwise surface as confusing
// strategy errors later.
void check_declaration(const Component& c, const PluginRecord& plugin) {
  if (!valid_name(c.name()))
    throw UserError(describe(plugin) + " registers a " + component_kind_name(c.kind()) + " with invalid name '" +
                    c.name() + "' (use letters, digits, '_', '.', '-')");
  const char* required_base = nullptr;
  switch (c.kind()) {
    case ComponentKind::Pass: required_base = dynamic_cast<const Pass*>(&c) ? nullptr : "strata::Pass"; break;
    case ComponentKind::Model: required_base = dynamic_cast<const ModelFactory*>(&c) ? nullptr : "strata::ModelFactory"; break;
    case ComponentKind::Dataset: required_base = dynamic_cast<const DatasetFactory*>(&c) ? nullptr : "strata::DatasetFactory"; break;
    case ComponentKind::Optimizer: required_base = dynamic_cast<const OptimizerFactory*>(&c) ? nullptr : "strata::OptimizerFactory"; break;
    case ComponentKind::Operator: required_base = dynamic_cast<const ops::OperatorImplBase*>(&c) ? nullptr : "strata::ops::OperatorImpl"; break;
    case ComponentKind::Schedule: required_base = dynamic_cast<const pipeline::Schedule*>(&c) ? nullptr : "strata::pipeline::Schedule"; break;
    case ComponentKind::Communicator: required_base = dynamic_cast<const CommunicatorBackend*>(&c) ? nullptr : "strata::CommunicatorBackend"; break;
  }
  if (required_base)
    throw UserError(describe(plugin) + ": " + component_label(c) + " does not derive from " + required_base);
  if (c.kind() == ComponentKind::Pass)
    for (const char* reserved : {"name", "enabled"})
      if (c.info().schema.find(reserved))
        throw UserError(describe(plugin) + ": " + component_label(c) + " declares key '" + reserved +
                        "', which every [[pass]] already has");
}

}  // namespace

void ComponentRegistry::register_plugin(PluginRecord record, void (*register_fn)(Registry&)) {
  if (const PluginRecord* other = find_plugin(record.name))
    throw UserError("plugin name '" + record.name + "' is used by both " + other->path + " and " + record.path +
                    "; remove one of them from the plugin search path");
  std::vector<std::unique_ptr<Component>> pending;
  pending_ = &pending;
  try {
    register_fn(*this);
  } catch (const UserError&) {
    pending_ = nullptr;
    throw;
  } catch (const std::exception& e) {
    pending_ = nullptr;
    throw UserError(describe(record) + " failed while registering its components: " + e.what());
  } catch (...) {
    pending_ = nullptr;
    throw UserError(describe(record) + " failed while registering its components (unknown exception)");
  }
  pending_ = nullptr;
  register_components(std::move(record), std::move(pending));
}

void ComponentRegistry::register_components(PluginRecord record, std::vector<std::unique_ptr<Component>> pending) {
  if (const PluginRecord* other = find_plugin(record.name))
    throw UserError("plugin name '" + record.name + "' is used by both " + other->path + " and " + record.path);
  std::set<Key> seen;
  for (const auto& c : pending) {
    if (!c) throw std::invalid_argument("null component");
    check_declaration(*c, record);
    Key key{c->kind(), c->name()};
    if (auto it = components_.find(key); it != components_.end())
      throw UserError(component_label(*c) + " is registered by both " + describe(plugins_[owner_.at(it->second.get())]) +
                      " and " + describe(record) + "; remove one of the plugins or rename the component");
    if (!seen.insert(key).second)
      throw UserError(describe(record) + " registers " + component_label(*c) + " twice");
  }

  size_t index = plugins_.size();
  for (auto& c : pending) {
    record.components.push_back(c.get());
    owner_[c.get()] = index;
    Key key{c->kind(), c->name()};
    components_[key] = std::move(c);
  }
  plugins_.push_back(std::move(record));
}

const Component* ComponentRegistry::find(ComponentKind kind, const std::string& name) const {
  auto it = components_.find({kind, name});
  return it == components_.end() ? nullptr : it->second.get();
}

const Pass* ComponentRegistry::find_pass(const std::string& name) const {
  return static_cast<const Pass*>(find(ComponentKind::Pass, name));
}

std::vector<const Component*> ComponentRegistry::components(ComponentKind kind) const {
  std::vector<const Component*> out;
  for (const auto& [key, c] : components_)
    if (key.first == kind) out.push_back(c.get());
  return out;
}

std::vector<std::string> ComponentRegistry::names(ComponentKind kind) const {
  std::vector<std::string> out;
  for (const auto* c : components(kind)) out.push_back(c->name());
  return out;
}

const PluginRecord* ComponentRegistry::plugin_of(const Component* component) const {
  auto it = owner_.find(component);
  return it == owner_.end() ? nullptr : &plugins_[it->second];
}

const PluginRecord* ComponentRegistry::find_plugin(const std::string& name) const {
  for (const auto& p : plugins_)
    if (p.name == name) return &p;
  return nullptr;
}

namespace {

// Edits (insert, delete, substitute, swap two neighbours) between a and b: "fdsp" is one from "fsdp".
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

}  // namespace

std::string did_you_mean(const std::string& wrong, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, wrong.size() / 3) + 1;
  for (const auto& c : candidates) {
    size_t d = edit_distance(wrong, c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  return best.empty() ? "" : "did you mean '" + best + "'?";
}

}  // namespace strata
