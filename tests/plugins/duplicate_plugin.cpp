// Registers a pass whose name the good plugin already uses.
#include "strata/plugin.h"

namespace {

class TestPass final : public strata::Pass {
 public:
  TestPass() : Pass({strata::ComponentKind::Pass, "test_pass", "The same name again", {}}, {}) {}
  void apply(strata::Job&, const strata::Config&) const override {}
};

void register_components(strata::Registry& registry) { registry.add(std::make_unique<TestPass>()); }

}  // namespace

STRATA_PLUGIN("duplicate", "0.0.1", register_components)
