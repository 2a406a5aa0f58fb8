// Data parallel: parameters broadcast from rank 0, then gradients averaged over the
// data-parallel group in buckets, each launched asynchronously as soon as all of its gradients
// are final during the last micro-batch's backward, so communication overlaps computation.
// Buckets travel in amp's reduce_dtype when one is set.
#include <chrono>
#include <optional>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "strata/plugin.h"

namespace strata::ddp {
namespace {

struct Bucket {
  std::vector<size_t> params;  // indices into Reducer::params_
  at::Tensor flat;
  size_t pending = 0;
  WorkPtr work;
};

// Tracks which gradients are final and reduces buckets as they fill.
class Reducer {
 public:
  Reducer(std::shared_ptr<nn::Model> model, Communicator& comm, double bucket_mb, bool ignore_unused,
          std::optional<at::ScalarType> reduce_dtype)
      : model_(std::move(model)), comm_(comm), ignore_unused_(ignore_unused) {
    for (const auto& p : model_->named_parameters())
      if (p.value().requires_grad()) names_.push_back(p.key()), params_.push_back(p.value());
    // Gradients arrive roughly in reverse registration order, so buckets are filled from the end.
    const auto limit = static_cast<uint64_t>(bucket_mb * 1024 * 1024);
    uint64_t bytes = 0;
    bucket_of_.resize(params_.size());
    for (size_t i = params_.size(); i-- > 0;) {
      const bool full = bytes > 0 && bytes + params_[i].nbytes() > limit;
      if (buckets_.empty() || full || params_[buckets_.back().params.front()].scalar_type() != params_[i].scalar_type()) {
        buckets_.emplace_back();
        bytes = 0;
      }
      buckets_.back().params.push_back(i);
      bucket_of_[i] = buckets_.size() - 1;
      bytes += params_[i].nbytes();
    }
    for (auto& b : buckets_) {
      int64_t n = 0;
      for (size_t i : b.params) n += params_[i].numel();
      const at::TensorOptions options = params_[b.params.front()].options().requires_grad(false);
      b.flat = at::empty({n}, reduce_dtype ? options.dtype(*reduce_dtype) : options);
    }
    ready_.assign(params_.size(), false);
  }

  void broadcast_parameters() {
    at::NoGradGuard no_grad;
    for (auto& p : params_) comm_.broadcast(p, 0)->wait();
  }

  void install_hooks() {
    for (size_t i = 0; i < params_.size(); ++i) {
      struct Hook final : torch::autograd::PostAccumulateGradHook {
        Reducer* reducer;
        size_t index;
        Hook(Reducer* r, size_t i) : reducer(r), index(i) {}
        void operator()(const torch::autograd::Variable&) override { reducer->gradient_ready(index); }
      };
      torch::autograd::impl::set_post_acc_grad_hooks(params_[i], std::make_unique<Hook>(this, i));
    }
  }

  // Only the last backward of a step reduces; earlier ones just accumulate locally.
  void begin_micro_batch(bool last) {
    syncing_ = last;
    if (!last) return;
    ready_.assign(params_.size(), false);
    for (auto& b : buckets_) b.pending = b.params.size(), b.work.reset();
  }

  void gradient_ready(size_t index) {
    if (!syncing_ || ready_[index]) return;
    ready_[index] = true;
    Bucket& b = buckets_[bucket_of_[index]];
    if (--b.pending == 0) launch(b);
  }

  // After the last backward (sync_gradients): reduce what never got a gradient, wait, and write
  // averages back.
  // Returns the milliseconds spent waiting for communication that backward did not hide.
  double finish() {
    if (!syncing_) return 0.0;
    std::vector<std::string> unused;
    for (size_t i = 0; i < params_.size(); ++i)
      if (!ready_[i]) unused.push_back(names_[i]);
    if (!unused.empty() && !ignore_unused_) {
      // No collective may be left in flight while the error unwinds: every rank fails here alike.
      for (auto& b : buckets_)
        if (b.work) b.work->wait();
      std::string list;
      for (const auto& n : unused) list += (list.empty() ? "" : ", ") + n;
      throw UserError("pass 'ddp': parameters got no gradient this step: " + list +
                      "; set unused_parameters = \"ignore\" if that is expected");
    }
    for (size_t i = 0; i < params_.size(); ++i)
      if (!ready_[i]) {
        params_[i].mutable_grad() = at::zeros_like(params_[i]);
        gradient_ready(i);
      }
    const auto waiting = std::chrono::steady_clock::now();
    for (auto& b : buckets_) {
      b.work->wait();
      int64_t offset = 0;
      for (size_t i : b.params) {
        const int64_t n = params_[i].numel();
        params_[i].mutable_grad().view(-1).copy_(b.flat.narrow(0, offset, n));
        offset += n;
      }
    }
    syncing_ = false;
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - waiting).count();
  }

 private:
  void launch(Bucket& b) {
    int64_t offset = 0;
    for (size_t i : b.params) {
      const int64_t n = params_[i].numel();
      b.flat.narrow(0, offset, n).copy_(params_[i].grad().reshape(-1));
      offset += n;
    }
    b.work = comm_.all_reduce(b.flat, ReduceOp::Avg);
  }

  std::shared_ptr<nn::Model> model_;
  Communicator& comm_;
  bool ignore_unused_;
  std::vector<std::string> names_;
  std::vector<at::Tensor> params_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;
  std::vector<bool> ready_;
  bool syncing_ = false;
};

class DdpPass final : public Pass {
 public:
  DdpPass()
      : Pass({ComponentKind::Pass, "ddp", "Data parallel with bucketed all-reduce overlapped with backward",
              Schema()
                  .real("bucket_mb", 25.0, "Gradient bucket size in MiB", at_least(0.001))
                  .string("unused_parameters", "error", "Parameters that get no gradient: report them by name, or reduce zeros",
                          {"error", "ignore"})
                  .boolean("broadcast_buffers", true, "Broadcast buffers from rank 0 at start")},
             {Phase::Wrapping, {}, {"zero1", "zero2", "fsdp"}, {}, {}},
             {{Dim::Data}, {{Stage::SyncGradients, StageUse::Own}}}) {}

  void apply(Job& job, const Config& config) const override {
    Communicator& comm = job.topology->group(Dim::Data);
    auto reducer = std::make_shared<Reducer>(job.model, comm, config.get_float("bucket_mb"),
                                             config.get_string("unused_parameters") == "ignore", job.reduce_dtype);
    reducer->broadcast_parameters();
    if (config.get_bool("broadcast_buffers")) {
      at::NoGradGuard no_grad;
      for (auto& b : job.model->buffers()) comm.broadcast(b, 0)->wait();
    }
    reducer->install_hooks();
    // Buckets launch from autograd hooks during the step's last backward; the stage waits for them.
    job.add_hook(HookPoint::BeforeBackward, [reducer](StepContext& c) { reducer->begin_micro_batch(c.sync_gradients && c.last_backward); });
    job.program.own(Stage::SyncGradients, [reducer](StepContext& c) {
      if (c.sync_gradients) c.metrics.emplace_back("ddp_exposed_comm_ms", reducer->finish());
    });
  }
};

void register_components(Registry& registry) { registry.add(std::make_unique<DdpPass>()); }

}  // namespace
}  // namespace strata::ddp

STRATA_PLUGIN("ddp", "0.2.0", strata::ddp::register_components)
