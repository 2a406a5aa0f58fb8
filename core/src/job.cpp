#include "strata/job.h"

#include <cmath>

#include <ATen/ATen.h>

#include "strata/comm.h"

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

namespace strata {

double clip_gradient_norm(const std::vector<at::Tensor>& grads, double max_norm, Communicator* sum_over) {
  std::vector<at::Tensor> norms;
  for (const auto& g : grads)
    if (g.defined()) norms.push_back(g.detach().to(at::kFloat).norm());
  at::Tensor total = norms.empty() ? at::zeros({}, at::kFloat) : at::stack(norms).norm();
  if (sum_over && sum_over->size() > 1) {
    // Every rank takes part, even one without gradients, so the collective matches.
    at::Tensor squared = total.square().to(at::kDouble);
    for (const auto& g : grads)
      if (g.defined()) {
        squared = squared.to(g.device());  // device communicators (nccl) take device tensors
        break;
      }
    sum_over->all_reduce(squared, ReduceOp::Sum)->wait();
    total = squared.sqrt();
  } else if (norms.empty()) {
    return 0.0;
  }
  const double norm = total.item<double>();
  if (max_norm > 0 && std::isfinite(norm)) {
    const double coefficient = max_norm / (norm + 1e-6);
    if (coefficient < 1.0) {
      at::NoGradGuard no_grad;
      for (const auto& g : grads)
        if (g.defined()) g.mul_(coefficient);
    }
  }
  return norm;
}

}  // namespace strata
