// Components: the named things plugins register (passes, operator implementations, optimizers,
// communicator backends, models, datasets), each with the config keys it accepts.
#pragma once

#include <memory>
#include <string>

#include "strata/config.h"
#include "strata/export.h"

namespace strata {

enum class ComponentKind { Pass, Operator, Optimizer, Communicator, Model, Dataset, Schedule };
STRATA_API const char* component_kind_name(ComponentKind kind);

struct ComponentInfo {
  ComponentKind kind = ComponentKind::Pass;
  std::string name;     // unique within its kind across all loaded plugins
  std::string summary;  // one line for `strata plugins` and the docs
  Schema schema;        // the keys its strategy section accepts
};

namespace detail {
struct ComponentState;  // the class's state, defined in core
}  // namespace detail

class STRATA_API Component {
 public:
  explicit Component(ComponentInfo info);
  virtual ~Component();
  Component(const Component&) = delete;
  Component& operator=(const Component&) = delete;

  const ComponentInfo& info() const;
  const std::string& name() const;
  ComponentKind kind() const;

  // Checks that involve several keys at once; single keys are checked against the schema first
  // and this runs only when they all passed.
  virtual void validate(const Config& config, const SourcePos& section, Diagnostics& diagnostics) const;

 private:
  // In core (one pointer here): a component's size, which every plugin's component class embeds,
  // never changes.
  std::unique_ptr<detail::ComponentState> state_;
};

}  // namespace strata
