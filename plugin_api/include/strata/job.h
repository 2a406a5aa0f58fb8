// The training job that passes transform: mesh, model, optimizer construction, the step program
// with its hooks, the loss, and the state that checkpoints carry.
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
#include "strata/placement.h"
#include "strata/step_program.h"
#include "strata/topology.h"

namespace strata {

// Something that owns state a checkpoint must carry; keys are stable across runs.
class STRATA_API Stateful {
 public:
  virtual ~Stateful();
  virtual NamedTensors save() const = 0;
  // Receives exactly the names and shapes save() produced; a missing or mis-shaped tensor is an
  // error. Loading is collective: every rank loads every state, in key order.
  virtual void load(const NamedTensors& tensors) = 0;
  // Placements of the save() tensors that are pieces of larger ones (the others are whole):
  // checkpoints record them and reassemble any layout's pieces on load.
  virtual Placements placements() const { return {}; }
  // True when every data-parallel rank holds the same values in the whole (unsliced) tensors
  // save() returns, as the gradient-sync pass keeps them: a checkpoint then stores each of them
  // once, the writing spread over the data ranks, instead of once per rank.
  virtual bool same_on_data_ranks() const { return false; }
};

// A gradient as this rank holds it, placed as its parameter (or the parameter's piece) is.
struct LocalGradient {
  at::Tensor grad;
  Placement placement;
};

// One micro-batch as this rank computes it: input tokens and targets [B, T] (T = seq_len, or this
// rank's share under context parallel) and where those tokens sit in their window.
struct MicroBatch {
  at::Tensor inputs, targets;
  nn::SequenceLayout sequence;
};

namespace detail {
struct JobState;  // the class's state, defined in core
}  // namespace detail

class STRATA_API Job {
 public:
  Job(Config job, Config model, Config data, Config optimizer, c10::Device device);
  ~Job();
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  const Config& job_config() const;
  const Config& model_config() const;
  const Config& data_config() const;
  const Config& optimizer_config() const;
  c10::Device device() const;

  // Ranks, groups and communicators of this job (a one-rank topology in a single process).
  std::shared_ptr<Topology> topology;
  std::shared_ptr<nn::Model> model;
  // What kept this rank's part of each block while the model was built (Pass::keeper_at_build),
  // for the pass that made it to finish the sharding in apply(); null when the model was built whole.
  std::shared_ptr<nn::BuildKeeper> build_keeper;
  // Builds the optimizer once passes are applied; a pass may wrap it (sharding, WSAM).
  std::function<std::unique_ptr<Optimizer>(std::vector<ParamGroup>)> make_optimizer;

  // One training step as named stages (strata/step_program.h). Core provides every stage before
  // passes apply; a pass owns or wraps the stages its Claims declare.
  StepProgram program;

  // The loss of one micro-batch: logits [B, T, V] (as the model returns them) and targets [B, T]
  // -> mean loss over tokens. Core's is cross entropy; a pass replaces it (vocab-parallel loss).
  std::function<at::Tensor(const at::Tensor& logits, const at::Tensor& targets)> loss;
  // This rank's mean loss -> the loss the step reports, identical on every rank (0-dim fp64
  // tensors, left on the device: the trainer reads the result). Core's averages over the data
  // group; a pass that splits a sample's tokens over ranks (context parallel) replaces it.
  std::function<at::Tensor(const at::Tensor& local_loss)> reduce_loss;

  // The micro-batch this rank computes from a batch of [B, seq_len + 1] window tokens; training,
  // evaluation and a pipeline's stages all go through it. Core's takes the whole window and marks
  // packed documents ([data] document_end, reset_positions); context parallel keeps this rank's
  // tokens of it.
  std::function<MicroBatch(const at::Tensor& batch)> split_batch;

  // The index-th validation batch ([micro_batch, seq_len + 1] tokens on the job's device); the
  // evaluate stage averages the loss of [job] eval_batches of them.
  std::function<at::Tensor(int64_t index)> validation_batch;

  // The gradients the optimizer is about to apply, as this rank holds them, with their
  // placements (clipping and non-finite checks read and scale these). Core's default returns
  // every parameter's .grad(), sharded over the pipeline dimension (stages hold disjoint
  // parameters) and over the tensor dimension for split layers; a sharding pass returns its
  // pieces, sharded over the data dimension too.
  std::function<std::vector<LocalGradient>()> local_gradients;

  // The precision of data-parallel communication, set by a precision pass (amp, phase Precision)
  // for the gradient-sync pass (phase Wrapping, so it applies later). Gradients are averaged in
  // reduce_dtype; a pass that gathers full parameters before use (fsdp) gathers them, and so
  // computes with them and their gradients, in gather_dtype. Unset: the parameters' own dtype.
  std::optional<at::ScalarType> reduce_dtype, gather_dtype;

  // Hooks run inside the stages (strata/step_program.h says where).
  void add_hook(HookPoint point, StepHook hook);
  void run_hooks(HookPoint point, StepContext& context) const;

  // Registers state under `key` ("model", "optimizer", "data", "rng", or a pass's name).
  void register_state(const std::string& key, std::shared_ptr<Stateful> state);
  // Replaces a registered state: a sharding pass saves "model" as its shards.
  void replace_state(const std::string& key, std::shared_ptr<Stateful> state);
  const std::map<std::string, std::shared_ptr<Stateful>>& states() const;

  // A change of this rank's full parameters that the master weights do not carry: WSAM's local
  // perturbation, each data rank's own. A pass that gathers full parameters before each use
  // (fsdp) keeps none between uses to change in place, so it registers here how it takes such a
  // change (1.8): called with tensors by parameter name (model->named_parameters()' names and
  // shapes), it adds them to those parameters wherever it gathers them from then on; called with
  // none, it stops. Both calls come between steps' forward and backward passes, never inside
  // one. Unset (an empty function) when no pass gathers.
  using FullParameterOffsets = std::function<void(const NamedTensors& offsets)>;
  void set_offset_full_parameters(FullParameterOffsets offset);
  const FullParameterOffsets& offset_full_parameters() const;

 private:
  // Configs, hooks and states live in core (one pointer here). The public members above are
  // frozen for 1.x; what the job gains comes as functions.
  std::unique_ptr<detail::JobState> state_;
};

// torch.nn.utils.clip_grad_norm_'s rule, the one clipping of Strata: the 2-norm of the whole
// gradients `grads` are pieces of, and when max_norm > 0 and the norm is finite, every gradient
// scaled by max_norm / (norm + 1e-6) if that is below 1. With a `topology`, each rank adds its
// pieces' squared norms divided by their number of replicas (world size over the sizes of the
// dimensions they are sharded over), and one all-reduce over the world on `device` (the job's:
// every rank takes part, one without gradients too) sums them: every whole gradient counted
// exactly once, whatever its placement. Without one, `grads` are this rank's alone. A partial
// gradient (before its sync) has no norm yet: std::logic_error. Returns the norm before
// clipping, a 0-dim fp64 tensor on `device`; undefined tensors are skipped. On a GPU nothing is
// read to the host: the scale is computed and applied on the device (every gradient multiplied,
// by 1 when not clipping); on the CPU the norm is read and the gradients left alone below it.
STRATA_API at::Tensor clip_gradient_norm(const std::vector<LocalGradient>& grads, double max_norm, const Topology* topology,
                                     c10::Device device);

// Whether any rank found what this one looked for: collective over the world on the job's
// device. A pass that refuses a model without the layers it rewrites asks it, since a pipeline
// rank holds only its stages' blocks (the others are nn::AbsentBlock).
STRATA_API bool found_on_any_rank(const Job& job, bool found_here);

}  // namespace strata
