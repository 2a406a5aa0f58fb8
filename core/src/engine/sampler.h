// Cuts a token stream into training windows of seq_len + 1 tokens (inputs and shifted targets),
// shuffled per epoch from the seed, and hands them out in order. Its position is all the state a
// checkpoint needs to continue the exact same sequence. The batch after the one just handed out
// is read on a background thread while the caller trains.
#pragma once

#include <cstdint>
#include <future>
#include <vector>

#include <ATen/core/Tensor.h>

#include "strata/data.h"

namespace strata::engine {

// Why `data` cannot feed windows of seq_len + 1 tokens in both splits, or empty when it can.
std::string too_short_for_windows(const TokenDataset& data, int64_t seq_len);
// Why a model of `model_vocab` tokens cannot read `data`'s tokens, or empty when it can.
std::string vocabulary_problem(const TokenDataset& data, int64_t model_vocab);

class BatchSampler {
 public:
  BatchSampler(const TokenDataset& data, int64_t seq_len, uint64_t seed, bool shuffle);

  ~BatchSampler();
  // The next `count` training windows, [count, seq_len + 1] int64.
  at::Tensor next_train(int64_t count);
  // Validation windows [first, first + count), wrapping around the split: the same for every call.
  at::Tensor val_batch(int64_t first, int64_t count) const;

  // The position of the next batch next_train returns (not of the one being prefetched).
  int64_t epoch() const { return consumed_epoch_; }
  int64_t cursor() const { return consumed_cursor_; }
  void set_position(int64_t epoch, int64_t cursor);
  int64_t train_windows() const { return train_windows_; }

 private:
  void read_window(Split split, int64_t window, int64_t* out) const;
  void start_epoch(int64_t epoch);
  at::Tensor read_train(int64_t count);  // advances epoch_/cursor_
  void drop_prefetch();

  const TokenDataset& data_;
  int64_t seq_len_;
  uint64_t seed_;
  bool shuffle_;
  int64_t train_windows_, val_windows_;
  int64_t epoch_ = 0, cursor_ = 0;  // where the reader is, prefetch included
  int64_t consumed_epoch_ = 0, consumed_cursor_ = 0;
  std::vector<int64_t> order_;  // window order of the current epoch
  std::future<at::Tensor> prefetch_;
  int64_t prefetch_count_ = 0;
};

}  // namespace strata::engine
