// A well-formed plugin: one pass and one model, used by loader and CLI tests.
#include "strata/plugin.h"

namespace {

class TestPass final : public strata::Pass {
 public:
  TestPass()
      : Pass({strata::ComponentKind::Pass, "test_pass", "A pass for tests",
              strata::Schema().integer("level", 1, "How much", strata::between(0, 3))},
             {strata::Phase::Runtime, {}, {}, {}, {}}) {}
  void apply(strata::Job&, const strata::Config&) const override {}
};

class TestModel final : public strata::ModelFactory {
 public:
  TestModel()
      : ModelFactory({strata::ComponentKind::Model, "test_model", "A model for tests",
                      strata::Schema().integer("width", 4, "Width", strata::at_least(1))}) {}
  std::shared_ptr<strata::nn::Model> create(const strata::Config&) const override { return nullptr; }
};

void register_components(strata::Registry& registry) {
  registry.add(std::make_unique<TestPass>());
  registry.add(std::make_unique<TestModel>());
}

}  // namespace

STRATA_PLUGIN("good", "1.2.3", register_components)
