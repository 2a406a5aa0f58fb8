// Gradient buckets for the passes that keep every parameter in place and reduce gradients
// during backward: ddp (buckets all-reduced, parameters and optimizer whole), zero1 (all-reduced,
// optimizer on chunks) and zero2 (reduce-scattered). One mechanism: each bucket is a flat unit,
// reduced as soon as backward has finished all of its gradients in the step's last backward.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>

#include "reduction_window.h"
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

// Reduces each bucket as soon as backward has finished all of its gradients. Reduce-scattered
// buckets (zero2) keep at most two reductions in flight (reduction_window.h), so backward never
// holds every bucket's staged gradient at once; all-reduced ones (ddp, zero1) keep their
// averaged gradient whole anyway and are not held back.
class BucketReducer {
 public:
  // `reduce_every_micro_batch` (reduce-scattered buckets only): every synchronised micro-batch
  // reduces its share of a bucket once the bucket is complete and the shares are summed in the
  // gradient chunk, so full gradients do not outlive the micro-batch; `routed`: buckets of split
  // experts, whose completeness depends on the routing, which keep accumulating to the last.
  BucketReducer(std::string pass, Units units, bool ignore_unused, bool reduce_every_micro_batch = false, Units routed = {});

  // Call at BeforeBackward: `synchronised` (not WSAM's local pass) and `last` (the step's last
  // backward). Only the last reduces, unless reduce_every_micro_batch; earlier ones accumulate
  // locally.
  void begin_micro_batch(bool synchronised, bool last);
  void gradient_ready(size_t unit, size_t param);
  // After the last backward (the pass's sync_gradients stage): checks for parameters without a
  // gradient, reduces what is left and waits. Returns the milliseconds spent waiting for
  // communication that backward did not hide.
  double finish();
  // What the reductions since the last call moved (every share counted).
  Traffic take_reduced() { return std::exchange(reduced_, Traffic{}); }

 private:
  void start(FlatUnit& unit, bool final);
  bool routed(const FlatUnit& unit) const;

  std::string pass_;
  Units units_;
  bool ignore_unused_;
  bool reduce_every_micro_batch_;
  Units routed_;
  bool syncing_ = false;  // the step's last backward
  bool sharing_ = false;  // an earlier synchronised one that reduces its shares
  ReductionWindow window_;
  Traffic reduced_;
};

}  // namespace strata::sharding
