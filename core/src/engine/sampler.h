// Cuts a token stream into training windows of seq_len + 1 tokens (inputs and shifted targets),
// shuffled per epoch from the seed, and hands them out in order. Its position is all the state a
// checkpoint needs to continue the exact same sequence.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "strata/data.h"

namespace strata::engine {

class BatchSampler {
 public:
  BatchSampler(const TokenDataset& data, int64_t seq_len, uint64_t seed, bool shuffle);

  // The next `count` training windows, [count, seq_len + 1] int64.
  at::Tensor next_train(int64_t count);
  // Validation windows [first, first + count), wrapping around the split: the same for every call.
  at::Tensor val_batch(int64_t first, int64_t count) const;

  int64_t epoch() const { return epoch_; }
  int64_t cursor() const { return cursor_; }
  void set_position(int64_t epoch, int64_t cursor);
  int64_t train_windows() const { return train_windows_; }

 private:
  void read_window(Split split, int64_t window, int64_t* out) const;
  void start_epoch(int64_t epoch);

  const TokenDataset& data_;
  int64_t seq_len_;
  uint64_t seed_;
  bool shuffle_;
  int64_t train_windows_, val_windows_;
  int64_t epoch_ = 0, cursor_ = 0;
  std::vector<int64_t> order_;  // window order of the current epoch
};

}  // namespace strata::engine
