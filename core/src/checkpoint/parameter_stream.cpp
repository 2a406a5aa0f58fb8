// Fill a parameter as the export reaches it, give its pages back once written (parameter_stream.h).
#include "parameter_stream.h"

#include <sys/mman.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include "strata/errors.h"

namespace strata::engine {
namespace {

c10::StorageImpl* storage_of(const at::Tensor& t) { return t.storage().unsafeGetStorageImpl(); }

// The whole pages inside a written parameter's storage go back to the system
// (madvise MADV_DONTNEED: private memory reads as zeros afterwards, and nothing reads it again;
// the model is discarded after the export). The partial pages at either end stay, so the
// allocator's bookkeeping beside the allocation is never touched.
void release_pages(const at::Tensor& parameter) {
  const c10::Storage& storage = parameter.storage();
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(storage.data());
  const uintptr_t first = (begin + page - 1) / page * page, last = (begin + storage.nbytes()) / page * page;
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

}  // namespace

void refuse_non_finite(const Checkpoint& checkpoint, const TensorRequest& request) {
  if (!at::isfinite(request.target).all().item<bool>())
    throw UserError("checkpoint " + checkpoint.path().string() + ": tensor for '" + request.name.substr(request.name.find('/') + 1) +
                    "' holds NaN or infinite values");
}

ParameterStream::ParameterStream(const Checkpoint& checkpoint, std::vector<TensorRequest> parameters, const NamedTensors& written,
                                 NonFinite non_finite, int64_t batch_bytes)
    : checkpoint_(checkpoint), parameters_(std::move(parameters)), writes_left_(parameters_.size(), 0), filled_(parameters_.size(), false),
      non_finite_(non_finite), batch_bytes_(batch_bytes) {
  std::map<c10::StorageImpl*, size_t> by_storage;
  for (size_t i = 0; i < parameters_.size(); ++i)
    if (!by_storage.emplace(storage_of(parameters_[i].target), i).second) streams_ = false;  // two parameters, one storage
  for (const auto& [name, tensor] : written) {
    const auto found = by_storage.find(storage_of(tensor));
    if (found == by_storage.end()) {
      streams_ = false;  // computed by to_hf, not a view of a parameter
      continue;
    }
    parameter_of_[name] = found->second;
    if (writes_left_[found->second]++ == 0) fill_order_.push_back(found->second);
  }
  order_at_.assign(parameters_.size(), 0);
  for (size_t k = 0; k < fill_order_.size(); ++k) order_at_[fill_order_[k]] = k;
  if (!streams_) return;
  // A parameter no written tensor views is filled now: the checkpoint must still hold it whole.
  std::vector<TensorRequest> unwritten;
  for (size_t i = 0; i < parameters_.size(); ++i)
    if (writes_left_[i] == 0) unwritten.push_back(parameters_[i]), filled_[i] = true;
  if (!unwritten.empty()) fill(unwritten);
}

void ParameterStream::fill(std::vector<TensorRequest>& requests) {
  checkpoint_.fill(requests, 0);
  if (non_finite_ == NonFinite::refused)
    for (const TensorRequest& q : requests) refuse_non_finite(checkpoint_, q);
}

void ParameterStream::fill_all() {
  std::vector<TensorRequest> rest;
  for (size_t i = 0; i < parameters_.size(); ++i)
    if (!filled_[i]) rest.push_back(parameters_[i]), filled_[i] = true;
  fill(rest);
  streams_ = false;
}

TensorWriteHooks ParameterStream::hooks() {
  if (!streams_) return {};
  TensorWriteHooks hooks;
  hooks.before = [this](const std::string& name) {
    const size_t i = parameter_of_.at(name);
    if (filled_[i]) return;
    // This parameter and the ones written after it, up to batch_bytes_ (at least this one).
    std::vector<TensorRequest> batch;
    int64_t bytes = 0;
    for (size_t k = order_at_[i]; k < fill_order_.size() && (batch.empty() || bytes < batch_bytes_); ++k) {
      const size_t j = fill_order_[k];
      if (filled_[j]) continue;
      batch.push_back(parameters_[j]);
      bytes += static_cast<int64_t>(parameters_[j].target.nbytes());
      filled_[j] = true;
    }
    fill(batch);
  };
  hooks.after = [this](const std::string& name) {
    const size_t i = parameter_of_.at(name);
    if (--writes_left_[i] == 0) release_pages(parameters_[i].target);
  };
  return hooks;
}

}  // namespace strata::engine
