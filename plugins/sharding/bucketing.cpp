#include "bucketing.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

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

BucketReducer::BucketReducer(std::string pass, Units units, bool ignore_unused, bool reduce_every_micro_batch, Units routed)
    : pass_(std::move(pass)),
      units_(std::move(units)),
      ignore_unused_(ignore_unused),
      reduce_every_micro_batch_(reduce_every_micro_batch),
      routed_(std::move(routed)) {
  for (const auto& unit : units_)
    if (reduce_every_micro_batch_ && !unit->reduce_scatters())
      throw std::logic_error("BucketReducer: only reduce-scattered buckets reduce every micro-batch (" + unit->name() + ")");
}

void BucketReducer::begin_micro_batch(bool synchronised, bool last) {
  syncing_ = synchronised && last;
  sharing_ = synchronised && !last && reduce_every_micro_batch_;
  if (syncing_ || sharing_)
    for (auto& unit : units_) unit->begin_backward();
}

bool BucketReducer::routed(const FlatUnit& unit) const {
  return holds(routed_, unit);
}

// A share is reduced only where every data rank reduces it alike: a bucket complete in this
// backward (an incomplete one, e.g. its weight gradients held back by zero_bubble, carries them
// to the next share or the last) of dense parameters.
void BucketReducer::gradient_ready(size_t unit, size_t param) {
  FlatUnit& bucket = *units_[unit];
  if (!(syncing_ || sharing_) || !bucket.mark_ready(param)) return;
  if (syncing_ || !routed(bucket)) start(bucket, /*final=*/syncing_);
}

void BucketReducer::start(FlatUnit& unit, bool final) {
  unit.start_reduce(final);
  reduced_ += unit.reduce_traffic(final);
  if (unit.reduce_scatters()) window_.started(unit);
}

double BucketReducer::finish() {
  check_unused_parameters(pass_, ignore_unused_, units_);
  for (auto& unit : units_)
    if (!unit->complete()) {
      unit->fill_missing_gradients();
      start(*unit, /*final=*/true);
    }
  const auto waiting = std::chrono::steady_clock::now();
  for (auto& unit : units_) unit->wait_reduced();
  syncing_ = false;
  return window_.finish() + std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - waiting).count();
}

}  // namespace strata::sharding
