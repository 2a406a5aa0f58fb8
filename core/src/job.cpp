#include "strata/job.h"

#include "strata/data.h"
#include "strata/errors.h"

namespace strata {

Stateful::~Stateful() = default;
TokenDataset::~TokenDataset() = default;
DatasetFactory::~DatasetFactory() = default;
Optimizer::~Optimizer() = default;
OptimizerFactory::~OptimizerFactory() = default;
ModelFactory::~ModelFactory() = default;

Job::Job(Config job, Config model, Config data, Config optimizer, c10::Device device)
    : job_(std::move(job)),
      model_config_(std::move(model)),
      data_config_(std::move(data)),
      optimizer_config_(std::move(optimizer)),
      device_(device) {}
Job::~Job() = default;

void Job::add_hook(HookPoint point, StepHook hook) { hooks_[point].push_back(std::move(hook)); }

void Job::run_hooks(HookPoint point, StepContext& context) const {
  auto it = hooks_.find(point);
  if (it == hooks_.end()) return;
  for (const auto& hook : it->second) hook(context);
}

void Job::register_state(const std::string& key, std::shared_ptr<Stateful> state) {
  if (!states_.emplace(key, std::move(state)).second)
    throw std::logic_error("state key '" + key + "' is registered twice");
}

void Job::replace_state(const std::string& key, std::shared_ptr<Stateful> state) {
  auto it = states_.find(key);
  if (it == states_.end()) throw std::logic_error("state key '" + key + "' is replaced before it is registered");
  it->second = std::move(state);
}

}  // namespace strata
