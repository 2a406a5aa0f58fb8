// Gradient buckets for the passes that keep every parameter in place and reduce gradients
// during backward: ddp (buckets all-reduced, parameters and optimizer whole), zero1 (all-reduced,
// optimizer on chunks) and zero2 (reduce-scattered). One mechanism: each bucket is a flat unit,
// reduced as soon as backward has finished all of its gradients in the step's last backward.
#pragma once

#include <optional>
#include <string>

#include "sharded_training.h"

namespace strata::sharding {

// Buckets of at most `bucket_mb`, filled from the last parameter backwards (the order gradients
// arrive in), one dtype each; gradients travel in `reduce_dtype` when set. `include` selects the
// parameters (by name); none: every trainable one.
Units make_buckets(nn::Model& model, Communicator& comm, double bucket_mb, GradReduce reduce,
                   std::optional<at::ScalarType> reduce_dtype, const std::function<bool(const std::string&)>& include = {});

// Reduces each bucket as soon as backward has finished all of its gradients.
class BucketReducer {
 public:
  BucketReducer(std::string pass, Units units, bool ignore_unused);

  // Call at BeforeBackward: only the step's last backward reduces (`last`); earlier ones
  // accumulate locally.
  void begin_micro_batch(bool last);
  void gradient_ready(size_t unit, size_t param);
  // After the last backward (the pass's sync_gradients stage): checks for parameters without a
  // gradient, reduces what is left and waits. Returns the milliseconds spent waiting for
  // communication that backward did not hide.
  double finish();

 private:
  std::string pass_;
  Units units_;
  bool ignore_unused_;
  bool syncing_ = false;
};

}  // namespace strata::sharding
