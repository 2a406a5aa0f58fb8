#include "test_registry.h"

namespace strata::test {

namespace {

class TinyModel final : public ModelFactory {
 public:
  TinyModel()
      : ModelFactory({ComponentKind::Model, "tiny", "tiny model",
                   Schema().integer("width", 8, "width", at_least(1)).integer("heads", 2, "heads", at_least(1))}) {}
  void validate(const Config& config, const SourcePos& section, Diagnostics& diagnostics) const override {
    if (config.get_int("width") % config.get_int("heads") != 0) diagnostics.error(section, "width must divide by heads");
  }
  std::shared_ptr<nn::Model> create(const Config&) const override { return nullptr; }
};

class ToyData final : public DatasetFactory {
 public:
  ToyData() : DatasetFactory({ComponentKind::Dataset, "toy", "toy data", Schema().required_string("path", "where")}) {}
  std::unique_ptr<TokenDataset> open(const Config&, const DataContext&) const override { return nullptr; }
};

class FakeAdamW final : public OptimizerFactory {
 public:
  FakeAdamW()
      : OptimizerFactory({ComponentKind::Optimizer, "adamw", "adamw", Schema().real("beta1", 0.9, "b1", between(0, 1))}) {}
  std::unique_ptr<Optimizer> create(std::vector<ParamGroup>, const Config&) const override { return nullptr; }
};

}  // namespace

void fill_test_registry(Registry& registry) {
  registry.add(std::make_unique<TinyModel>());
  registry.add(std::make_unique<ToyData>());
  registry.add(std::make_unique<FakeAdamW>());
  registry.add(std::make_unique<FakePass>("alpha", PassOrdering{Phase::Precision, {}, {}, {}, {}},
                                          Schema().string("dtype", "bf16", "dtype", {"bf16", "fp16"})));
  registry.add(std::make_unique<FakePass>("beta", PassOrdering{Phase::Wrapping, {}, {"gamma"}, {}, {}},
                                          Schema().strings("wrap", {"block"}, "wrap")));
  registry.add(std::make_unique<FakePass>("gamma", PassOrdering{Phase::Wrapping, {}, {}, {}, {}}));
  registry.add(std::make_unique<FakePass>("needs", PassOrdering{Phase::Runtime, {"alpha"}, {}, {}, {}}));
}

}  // namespace strata::test
