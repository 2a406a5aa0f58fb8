// Components: the named things plugins register (passes, operator implementations, optimizers,
// communicator backends, models, datasets), each with the config keys it accepts.
#pragma once

#include <memory>
#include <string>
#include <vector>

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

// Optional (ABI 1.6), found by dynamic_cast on any component: values for keys its section leaves
// unset that follow from what it does set, or from a file it names (a model's weights carry their
// own description: transformers' config.json beside [model] init_from). Before `validate`, core
// sets each key still at its default to the value derived for it (origin File, at `source`, so
// `strata plan` names the file), then asks again with the filled config, until nothing changes.
// A key the strategy states is never replaced; `validate` checks it against the same source.
class STRATA_API DerivesDefaults {
 public:
  struct Derived {
    std::string key;
    Value value;
    SourcePos source;  // where the value comes from: a file, line 0
  };
  virtual ~DerivesDefaults();
  virtual std::vector<Derived> derived_defaults(const Config& config) const = 0;
};

// Optional (ABI 1.7), found by dynamic_cast on a model component: the `model_type`s of
// transformers' config.json whose weights it loads ("gpt2"; "llama", "mistral", "qwen2"). A
// strategy that leaves [job] model out and whose [model] init_from has a config.json trains the
// one registered model that loads its model_type, as transformers' AutoModel picks a class.
class STRATA_API LoadsHfModelTypes {
 public:
  virtual ~LoadsHfModelTypes();
  virtual std::vector<std::string> hf_model_types() const = 0;
};

}  // namespace strata
