#include "sampler.h"

#include <numeric>
#include <random>

#include <ATen/ATen.h>

#include "strata/errors.h"

namespace strata::engine {

BatchSampler::BatchSampler(const TokenDataset& data, int64_t seq_len, uint64_t seed, bool shuffle)
    : data_(data),
      seq_len_(seq_len),
      seed_(seed),
      shuffle_(shuffle),
      train_windows_((data.num_tokens(Split::Train) - 1) / seq_len),
      val_windows_((data.num_tokens(Split::Val) - 1) / seq_len) {
  if (const std::string problem = too_short_for_windows(data, seq_len); !problem.empty()) throw UserError(problem);
  if (shuffle && data.read_in_order())
    throw UserError("[job] shuffle = true, but the dataset is a stream read in order (strata::stream_dataset), which shuffling would "
                    "start again for almost every sample; set [job] shuffle = false");
  start_epoch(0);
}

std::string vocabulary_problem(const TokenDataset& data, int64_t model_vocab) {
  if (data.vocab_size() <= model_vocab) return {};
  return "[data] has a vocabulary of " + std::to_string(data.vocab_size()) + " tokens but [model] vocab_size is " + std::to_string(model_vocab);
}

std::string too_short_for_windows(const TokenDataset& data, int64_t seq_len) {
  if (data.num_tokens(Split::Train) - 1 < seq_len)
    return "[data] the training split has " + std::to_string(data.num_tokens(Split::Train)) +
           " tokens, fewer than one window of seq_len + 1 = " + std::to_string(seq_len + 1);
  if (data.num_tokens(Split::Val) - 1 < seq_len)
    return "[data] the validation split has " + std::to_string(data.num_tokens(Split::Val)) +
           " tokens, fewer than one window of seq_len + 1 = " + std::to_string(seq_len + 1) + "; raise val_fraction or use more data";
  return {};
}

void BatchSampler::start_epoch(int64_t epoch) {
  epoch_ = epoch;
  cursor_ = 0;
  order_.resize(static_cast<size_t>(train_windows_));
  std::iota(order_.begin(), order_.end(), 0);
  if (!shuffle_) return;
  // Fisher-Yates with a fixed generator: the order depends only on seed and epoch, on any
  // platform and standard library.
  std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(epoch));
  for (size_t i = order_.size() - 1; i > 0; --i) std::swap(order_[i], order_[rng() % (i + 1)]);
}

BatchSampler::~BatchSampler() { drop_prefetch(); }

void BatchSampler::drop_prefetch() {
  if (prefetch_.valid()) prefetch_.wait();
  prefetch_ = {};
}

void BatchSampler::set_position(int64_t epoch, int64_t cursor) {
  drop_prefetch();
  start_epoch(epoch);
  cursor_ = cursor;
  consumed_epoch_ = epoch;
  consumed_cursor_ = cursor;
}

void BatchSampler::read_window(Split split, int64_t window, int64_t* out) const {
  data_.read(split, window * seq_len_, seq_len_ + 1, out);
}

at::Tensor BatchSampler::next_train(int64_t count) {
  at::Tensor batch;
  if (prefetch_.valid() && prefetch_count_ == count) {
    batch = prefetch_.get();
  } else {
    drop_prefetch();
    epoch_ = consumed_epoch_;  // a prefetch of another size was read ahead; rewind
    start_epoch(epoch_);
    cursor_ = consumed_cursor_;
    batch = read_train(count);
  }
  consumed_epoch_ = epoch_;
  consumed_cursor_ = cursor_;
  prefetch_count_ = count;
  // Only the reader thread touches epoch_, cursor_ and order_ until the next call waits for it.
  prefetch_ = std::async(std::launch::async, [this, count] { return read_train(count); });
  return batch;
}

at::Tensor BatchSampler::read_train(int64_t count) {
  at::Tensor batch = at::empty({count, seq_len_ + 1}, at::kLong);
  int64_t* out = batch.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i) {
    if (cursor_ == train_windows_) start_epoch(epoch_ + 1);
    read_window(Split::Train, order_[static_cast<size_t>(cursor_++)], out + i * (seq_len_ + 1));
  }
  return batch;
}

at::Tensor BatchSampler::val_batch(int64_t first, int64_t count) const {
  at::Tensor batch = at::empty({count, seq_len_ + 1}, at::kLong);
  int64_t* out = batch.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i) read_window(Split::Val, (first + i) % val_windows_, out + i * (seq_len_ + 1));
  return batch;
}

}  // namespace strata::engine
