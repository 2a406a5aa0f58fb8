#include "bucketing.h"

#include <chrono>

#include <ATen/ATen.h>

namespace strata::sharding {

Units make_buckets(nn::Model& model, Communicator& comm, double bucket_mb, GradReduce reduce,
                   std::optional<at::ScalarType> reduce_dtype, const std::function<bool(const std::string&)>& include) {
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (const auto& p : model.named_parameters())
    if (p.value().requires_grad() && (!include || include(p.key()))) params.emplace_back(p.key(), p.value());
  const auto limit = static_cast<int64_t>(bucket_mb * 1024 * 1024);
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> groups;
  int64_t bytes = 0;
  for (size_t i = params.size(); i-- > 0;) {
    const at::Tensor& p = params[i].second;
    const auto size = static_cast<int64_t>(p.nbytes());
    if (groups.empty() || (bytes > 0 && bytes + size > limit) || groups.back().front().second.scalar_type() != p.scalar_type()) {
      groups.emplace_back();
      bytes = 0;
    }
    groups.back().push_back(params[i]);
    bytes += size;
  }
  Units units;
  for (auto& group : groups)
    units.push_back(std::make_shared<FlatUnit>("bucket" + std::to_string(units.size()), std::move(group), comm, reduce,
                                               /*persistent_params=*/true, UnitDtypes{std::nullopt, reduce_dtype}));
  return units;
}

Units make_data_parallel_buckets(nn::Model& model, Communicator& data, Communicator& expert_data, double bucket_mb,
                                 GradReduce reduce, std::optional<at::ScalarType> reduce_dtype, bool broadcast_buffers) {
  broadcast_model_state(model, data, expert_data, broadcast_buffers);
  const auto split_expert = split_expert_predicate(model);
  Units units = make_buckets(model, data, bucket_mb, reduce, reduce_dtype, [&](const std::string& name) { return !split_expert(name); });
  for (auto& unit : make_buckets(model, expert_data, bucket_mb, reduce, reduce_dtype, split_expert)) units.push_back(unit);
  return units;
}

BucketReducer::BucketReducer(std::string pass, Units units, bool ignore_unused)
    : pass_(std::move(pass)), units_(std::move(units)), ignore_unused_(ignore_unused) {}

void BucketReducer::begin_micro_batch(bool last) {
  syncing_ = last;
  if (last)
    for (auto& unit : units_) unit->begin_backward();
}

void BucketReducer::gradient_ready(size_t unit, size_t param) {
  if (syncing_ && units_[unit]->mark_ready(param)) units_[unit]->start_reduce();
}

double BucketReducer::finish() {
  check_unused_parameters(pass_, ignore_unused_, units_);
  for (auto& unit : units_)
    if (!unit->complete()) {
      unit->fill_missing_gradients();
      unit->start_reduce();
    }
  const auto waiting = std::chrono::steady_clock::now();
  for (auto& unit : units_) unit->wait_reduced();
  syncing_ = false;
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - waiting).count();
}

}  // namespace strata::sharding
