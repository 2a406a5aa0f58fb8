#include "strata/job.h"

#include <cmath>
#include <stdexcept>
#include <string>
#include <map>

#include <ATen/ATen.h>

#include "strata/comm.h"
#include "strata/topology.h"

#include "strata/data.h"
#include "strata/errors.h"

namespace strata {

Stateful::~Stateful() = default;
TokenDataset::~TokenDataset() = default;
bool TokenDataset::read_in_order() const { return false; }
DatasetFactory::~DatasetFactory() = default;
Optimizer::~Optimizer() = default;
GatedOptimizer::~GatedOptimizer() = default;
OptimizerFactory::~OptimizerFactory() = default;
ModelFactory::~ModelFactory() = default;

struct detail::JobState {
  Config job, model, data, optimizer;
  c10::Device device;
  std::map<HookPoint, std::vector<StepHook>> hooks;
  std::map<std::string, std::shared_ptr<Stateful>> states;
  Job::FullParameterOffsets offset_full_parameters;
};

Job::Job(Config job, Config model, Config data, Config optimizer, c10::Device device)
    : state_(std::make_unique<detail::JobState>(detail::JobState{std::move(job), std::move(model), std::move(data), std::move(optimizer), device, {}, {}, {}})) {}
Job::~Job() = default;
const Config& Job::job_config() const { return state_->job; }
const Config& Job::model_config() const { return state_->model; }
const Config& Job::data_config() const { return state_->data; }
const Config& Job::optimizer_config() const { return state_->optimizer; }
c10::Device Job::device() const { return state_->device; }
const std::map<std::string, std::shared_ptr<Stateful>>& Job::states() const { return state_->states; }

void Job::set_offset_full_parameters(FullParameterOffsets offset) { state_->offset_full_parameters = std::move(offset); }
const Job::FullParameterOffsets& Job::offset_full_parameters() const { return state_->offset_full_parameters; }

void Job::add_hook(HookPoint point, StepHook hook) { state_->hooks[point].push_back(std::move(hook)); }

void Job::run_hooks(HookPoint point, StepContext& context) const {
  auto it = state_->hooks.find(point);
  if (it == state_->hooks.end()) return;
  for (const auto& hook : it->second) hook(context);
}

void Job::register_state(const std::string& key, std::shared_ptr<Stateful> state) {
  if (!state_->states.emplace(key, std::move(state)).second)
    throw std::logic_error("state key '" + key + "' is registered twice");
}

void Job::replace_state(const std::string& key, std::shared_ptr<Stateful> state) {
  auto it = state_->states.find(key);
  if (it == state_->states.end()) throw std::logic_error("state key '" + key + "' is replaced before it is registered");
  it->second = std::move(state);
}

}  // namespace strata

namespace strata {

at::Tensor clip_gradient_norm(const std::vector<LocalGradient>& grads, double max_norm, const Topology* topology,
                              c10::Device device) {
  // Per-tensor norms stay on the gradients' device, grouped by their number of replicas;
  // squares are summed in double. Each group's norms come from one
  // _foreach_norm call (on a GPU one multi-tensor kernel instead of one launch per parameter;
  // on the CPU the same per-tensor norms as before), as torch's clip_grad_norm_ does.
  std::map<double, std::vector<at::Tensor>> grads_by_replicas;
  for (const auto& g : grads) {
    if (!g.grad.defined()) continue;
    if (!g.placement.partial_over.empty())
      throw std::logic_error("clip_gradient_norm: a gradient is still partial over " +
                             std::string(dim_name(g.placement.partial_over.front())) + " (clipping runs after the sync)");
    double replicas = 1;
    if (topology) {
      int sharded = 1;
      // Expert is a factor of data: a piece sharded over data (a ZeRO chunk of split experts) is
      // already one of data-size pieces.
      for (Dim d : g.placement.sharded_over) {
        if (d == Dim::Expert && g.placement.is_sharded_over(Dim::Data)) continue;
        // HSDP: pieces differ only within a shard group of data ranks.
        sharded *= d == Dim::Data && g.placement.data_shard_size > 0 ? static_cast<int>(g.placement.data_shard_size) : topology->size(d);
      }
      replicas = static_cast<double>(topology->world_size()) / sharded;
    }
    grads_by_replicas[replicas].push_back(g.grad.detach().to(at::kFloat));
  }
  const bool any = !grads_by_replicas.empty();
  at::Tensor squared = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device));
  for (const auto& [replicas, group] : grads_by_replicas)
    squared += at::stack(at::_foreach_norm(group, 2)).to(device, at::kDouble).square().sum() / replicas;
  if (topology && topology->world_size() > 1) {
    // Every rank takes part, even one without gradients, so the collective matches; device
    // communicators (nccl) take device tensors, so the sum lives on the job's device.
    topology->world().all_reduce(squared, ReduceOp::Sum)->wait();
  } else if (!any) {
    return squared;
  }
  at::Tensor norm = squared.sqrt();
  std::vector<at::Tensor> defined;
  for (const auto& g : grads)
    if (g.grad.defined()) defined.push_back(g.grad);
  if (max_norm <= 0 || defined.empty()) return norm;
  at::NoGradGuard no_grad;
  if (norm.is_cpu()) {
    // Reading is free here, and below max_norm the gradients are not touched at all.
    const double value = norm.item<double>();
    const double coefficient = max_norm / (value + 1e-6);
    if (std::isfinite(value) && coefficient < 1.0) at::_foreach_mul_(defined, coefficient);
  } else {
    // The same rule on the device (min(1, max_norm / (norm + 1e-6)); 1 when the norm is not
    // finite), rounded to fp32 as the host's scalar would be, so the host need not wait.
    const at::Tensor coefficient = at::clamp_max(max_norm / (norm + 1e-6), 1.0);
    at::_foreach_mul_(defined, at::where(at::isfinite(norm), coefficient, at::ones_like(coefficient)).to(at::kFloat));
  }
  return norm;
}

bool found_on_any_rank(const Job& job, bool found_here) {
  if (!job.topology || job.topology->world().size() == 1) return found_here;
  at::Tensor count = at::tensor(found_here ? 1.0 : 0.0, at::kDouble).to(job.device());
  job.topology->world().all_reduce(count, ReduceOp::Sum)->wait();
  return count.item<double>() > 0;
}

}  // namespace strata
