// Gradient buckets for the passes that keep every parameter in place and reduce gradients
// during backward: ddp (buckets all-reduced, parameters and optimizer whole), zero1 (all-reduced,
// optimizer on chunks) and zero2 (reduce-scattered). One mechanism: each bucket is a flat unit,
// reduced as soon as backward has finished all of its gradients in the step's last backward.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "sharded_training.h"

namespace strata::sharding {

// Buckets of at most `bucket_mb`, filled from the last parameter backwards (the order gradients
// arrive in), one dtype each; gradients travel in `reduce_dtype` when set. `include` selects the
// parameters (by name); none: every trainable one.
Units make_buckets(nn::Model& model, Communicator& comm, double bucket_mb, GradReduce reduce,
                   std::optional<at::ScalarType> reduce_dtype, const std::function<bool(const std::string&)>& include = {});

// Buckets for the data-parallel passes that keep parameters in place (ddp, zero1, zero2): dense
// parameters over `data`, split experts over `expert_data`, in buckets of their own; every
// parameter first broadcast from rank 0 of its group so replicas start equal (buffers too, over
// `data`, when `broadcast_buffers`).
Units make_data_parallel_buckets(nn::Model& model, Communicator& data, Communicator& expert_data, double bucket_mb,
                                 GradReduce reduce, std::optional<at::ScalarType> reduce_dtype, bool broadcast_buffers);

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
