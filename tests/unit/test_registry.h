// In-process components for strategy and pass-manager tests (no shared libraries involved).
#pragma once

#include <memory>
#include <string>

#include "strata/core/component_registry.h"
#include "strata/data.h"
#include "strata/model.h"
#include "strata/optimizer.h"

namespace strata::test {

class FakePass final : public Pass {
 public:
  FakePass(std::string name, PassOrdering ordering, Schema schema = {}, Claims claims = {})
      : Pass({ComponentKind::Pass, std::move(name), "fake pass", std::move(schema)}, std::move(ordering), std::move(claims)) {}
  void apply(Job&, const Config&) const override {}
};

// model "tiny" (width, heads), dataset "toy" (path required), optimizer "adamw" (beta1),
// passes "alpha" (precision), "beta" (wrapping, conflicts gamma), "gamma" (wrapping), "needs" (requires alpha)
void fill_test_registry(Registry& registry);

inline std::unique_ptr<ComponentRegistry> make_test_registry() {
  auto registry = std::make_unique<ComponentRegistry>();
  registry->register_plugin(PluginRecord{"test", "0", "<test>", "", {}}, &fill_test_registry);
  return registry;
}

}  // namespace strata::test
