// Test plugin: "ungated_sgd", plain SGD (p -= lr g) that is not a GatedOptimizer, as a third
// party's optimizer may be: under amp fp16 core reads the skip flag for it (one counted read a
// step) and steps only where it is 0. Every bundled optimizer gates on the device, so this is the
// only way tests reach that fallback.
#include <ATen/ATen.h>

#include "strata/plugin.h"

namespace {

using namespace strata;

class UngatedSgd final : public Optimizer {
 public:
  explicit UngatedSgd(std::vector<ParamGroup> groups) : groups_(std::move(groups)) {}
  void step(double lr) override {
    at::NoGradGuard no_grad;
    for (auto& g : groups_)
      for (auto& p : g.params)
        if (p.grad().defined()) p.sub_(p.grad(), lr);
  }
  NamedTensors state_tensors() override { return {}; }

 private:
  std::vector<ParamGroup> groups_;
};

class UngatedSgdFactory final : public OptimizerFactory {
 public:
  using OptimizerFactory::OptimizerFactory;
  std::unique_ptr<Optimizer> create(std::vector<ParamGroup> groups, const Config&) const override {
    return std::make_unique<UngatedSgd>(std::move(groups));
  }
};

void register_components(Registry& registry) {
  registry.add(std::make_unique<UngatedSgdFactory>(
      ComponentInfo{ComponentKind::Optimizer, "ungated_sgd", "Test only: plain SGD that cannot gate its step on the device", Schema()}));
}

}  // namespace

STRATA_PLUGIN("ungated_optimizer", "0.1.0", register_components)
