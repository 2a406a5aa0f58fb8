// Gradient reductions in flight during backward, oldest first, at most `limit` of them. A
// reduce-scatter holds its unit's whole gradient (the staging buffer it sends) until it
// completes; left to the sync stage, every unit's staging buffer was alive when backward ended,
// the whole model's gradient in the reduce dtype (GPT-2 medium, fsdp 4, amp bf16, SGD: a rank's
// peak fell from 4.44 to 2.86 GB with a window of 2). Starting one more than the limit waits
// for the oldest, which on a healthy network has long finished while backward went on.
// Used by fsdp's units and zero2's buckets.
#pragma once

#include <chrono>
#include <deque>
#include <utility>

#include "flat_unit.h"

namespace strata::sharding {

class ReductionWindow {
 public:
  static constexpr size_t kDefaultLimit = 2;
  explicit ReductionWindow(size_t limit = kDefaultLimit) : limit_(limit) {}

  // After `unit.start_reduce()`: completes the oldest reductions beyond the limit.
  void started(FlatUnit& unit) {
    in_flight_.push_back(&unit);
    while (in_flight_.size() > limit_) {
      const auto waiting = std::chrono::steady_clock::now();
      in_flight_.front()->wait_reduced();
      in_flight_.pop_front();
      waited_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - waiting).count();
    }
  }

  // At the sync stage, once the caller has waited for every unit: forgets them and returns the
  // milliseconds backward spent waiting for the oldest.
  double finish() {
    in_flight_.clear();
    return std::exchange(waited_ms_, 0.0);
  }

 private:
  size_t limit_;
  std::deque<FlatUnit*> in_flight_;
  double waited_ms_ = 0;
};

}  // namespace strata::sharding
