// The training job that passes transform: model, optimizer construction, step program hooks
// and the state that checkpoints carry.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "strata/config.h"
#include "strata/model.h"
#include "strata/optimizer.h"
#include "strata/topology.h"

namespace strata {

// Hook points of one optimizer step, in the order they run, then those around an evaluation
// (forward passes over validation batches without gradients; the context carries the step).
enum class HookPoint { BeforeForward, AfterForward, AfterBackward, BeforeStep, AfterStep, BeforeEvaluate, AfterEvaluate };

struct StepContext {
  int64_t step = 0;          // optimizer step being computed, from 1
  int64_t micro = 0;         // micro-batch index within the step
  int64_t micro_count = 1;   // micro-batches per step (gradient accumulation)
  at::Tensor loss;           // the micro-batch loss, set from AfterForward on
  bool skip_step = false;    // set by a hook to skip the optimizer update (e.g. non-finite grads)
  // This rank's micro-batches of the step ([micro_batch, seq_len + 1] tokens each, on the job's
  // device), read before the gradients are computed so a pass may run them more than once.
  std::vector<at::Tensor> batches;
  // False while a pass computes gradients it will synchronise itself (WSAM's local gradient);
  // the gradient-sync pass then leaves this backward alone.
  bool sync_gradients = true;
  double lr = 0.0;  // the step's learning rate, set from BeforeStep on
  // Backward runs on loss * loss_scale (amp's fp16 loss scaler); reported losses are unscaled.
  double loss_scale = 1.0;
  // Per-step figures a pass reports; they go into the step's metrics.jsonl object.
  std::vector<std::pair<std::string, double>> metrics;
};

using StepHook = std::function<void(StepContext&)>;

// Something that owns state a checkpoint must carry; keys are stable across runs.
class STRATA_API Stateful {
 public:
  virtual ~Stateful();
  virtual NamedTensors save() const = 0;
  // Receives exactly the names and shapes save() produced; a missing or mis-shaped tensor is an
  // error. Loading is collective: every rank loads every state, in key order.
  virtual void load(const NamedTensors& tensors) = 0;
  // The save() tensors that are slices of larger ones; checkpoints reassemble them on load.
  virtual Slices slices() const { return {}; }
};

class STRATA_API Job {
 public:
  Job(Config job, Config model, Config data, Config optimizer, c10::Device device);
  ~Job();
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  const Config& job_config() const { return job_; }
  const Config& model_config() const { return model_config_; }
  const Config& data_config() const { return data_config_; }
  const Config& optimizer_config() const { return optimizer_config_; }
  c10::Device device() const { return device_; }

  // Ranks, groups and communicators of this job (a one-rank topology in a single process).
  std::shared_ptr<Topology> topology;
  std::shared_ptr<nn::Model> model;
  // Set by the pass that keeps data-parallel replicas in step (ddp, zero, fsdp); training with
  // more than one data-parallel rank and no such pass is refused.
  std::string gradient_sync_pass;
  // Builds the optimizer once passes are applied; a pass may wrap it (sharding, WSAM).
  std::function<std::unique_ptr<Optimizer>(std::vector<ParamGroup>)> make_optimizer;

  // Computes the step's gradients: forward and backward over context.batches with the hooks, and
  // returns this rank's mean loss. Core sets it before passes apply; a pass that changes the step
  // program wraps it (WSAM runs it twice).
  std::function<double(StepContext&)> compute_gradients;

  // The gradients the optimizer is about to apply, as this rank holds them (clipping and
  // non-finite checks read and scale these). Core's default returns every parameter's .grad();
  // a sharding pass returns its gradient shards and sets gradients_sharded, so that norms are
  // summed over the data-parallel group.
  std::function<std::vector<at::Tensor>()> local_gradients;
  bool gradients_sharded = false;

  // The precision of data-parallel communication, set by a precision pass (amp, phase Precision)
  // for the gradient-sync pass (phase Wrapping, so it applies later). Gradients are averaged in
  // reduce_dtype; a pass that gathers full parameters before use (fsdp) gathers them, and so
  // computes with them and their gradients, in gather_dtype. Unset: the parameters' own dtype.
  std::optional<at::ScalarType> reduce_dtype, gather_dtype;

  void add_hook(HookPoint point, StepHook hook);
  void run_hooks(HookPoint point, StepContext& context) const;

  // Registers state under `key` ("model", "optimizer", "data", "rng", or a pass's name).
  void register_state(const std::string& key, std::shared_ptr<Stateful> state);
  // Replaces a registered state: a sharding pass saves "model" as its shards.
  void replace_state(const std::string& key, std::shared_ptr<Stateful> state);
  const std::map<std::string, std::shared_ptr<Stateful>>& states() const { return states_; }

 private:
  Config job_, model_config_, data_config_, optimizer_config_;
  c10::Device device_;
  std::map<HookPoint, std::vector<StepHook>> hooks_;
  std::map<std::string, std::shared_ptr<Stateful>> states_;
};

}  // namespace strata
