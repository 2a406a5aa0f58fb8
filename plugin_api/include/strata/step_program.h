// One training step as data: named stages (strata/claims.h), each provided by core or by the
// one pass that owns it and wrapped by any passes that wrap it, plus hook points inside the
// micro-batch schedule. `strata plan` prints the composition before anything runs; the trainer
// runs exactly what it prints.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "strata/claims.h"

namespace strata {

// Hook points inside a step, in the order they run for one micro-batch under the sequential
// schedule (a pipeline schedule interleaves micro-batches: forwards of later micro-batches may
// run before the backward of earlier ones, so a pass must key "last" on last_backward, not on
// the micro-batch index), then after the update, then around an evaluation.
enum class HookPoint {
  BeforeForward,
  AfterForward,
  BeforeBackward,
  AfterBackward,
  BeforeStep,
  AfterStep,
  BeforeEvaluate,
  AfterEvaluate,
};

struct StepContext {
  int64_t step = 0;          // optimizer step being computed, from 1
  int64_t micro = 0;         // micro-batch index within the step (of the forward or backward running)
  int64_t micro_count = 1;   // micro-batches per step (gradient accumulation)
  // True from BeforeBackward to AfterBackward of this rank's last backward of the step: where
  // gradient synchronisation starts.
  bool last_backward = false;
  at::Tensor loss;           // the micro-batch loss, set from AfterForward on
  bool skip_step = false;    // set by a hook to skip the optimizer update (e.g. non-finite grads)
  // This rank's micro-batches of the step ([micro_batch, seq_len + 1] tokens each, on the job's
  // device), set by prepare_batches before the gradients are computed so a pass may run them
  // more than once.
  std::vector<at::Tensor> batches;
  // False while a pass computes gradients it will synchronise itself (WSAM's local gradient);
  // the gradient-sync pass then leaves this backward alone.
  bool sync_gradients = true;
  double lr = 0.0;  // the step's learning rate, set from BeforeStep on
  // Backward runs on loss * loss_scale (amp's fp16 loss scaler); reported losses are unscaled.
  double loss_scale = 1.0;
  // Results of stages: this rank's mean micro-batch loss (gradients) and the gradient norm before
  // clipping (clip_gradients) as 0-dim fp64 tensors where they were computed (the job's device),
  // read to the host once at the end of the step with its other figures: on a GPU every read
  // waits for the device's queue to drain, so the host could no longer run ahead. The
  // validation loss (evaluate) is read where it is computed (evaluation is rare).
  at::Tensor local_loss;
  at::Tensor grad_norm;
  double val_loss = 0.0;
  // Per-step figures a pass reports; they go into the step's metrics.jsonl object, one entry per
  // name (a figure reported more than once in a step is summed). A figure still on the device
  // goes to StepProgram::report_device_figure instead.
  std::vector<std::pair<std::string, double>> metrics;
};

// ABI 1.4. The one way figures come from the device to the host: the elements of `values` (0-dim
// or 1-dim; undefined reads as 0), in order, as doubles, copied together. On a GPU each call waits
// for the device's queue to drain, so core calls it only on steps that record figures. Every call
// is counted (host_read_count), the count each metrics.jsonl line carries as host_reads; a pass
// that must read a device value during a step reads it here, so the count stays true.
STRATA_API std::vector<double> read_on_host(const std::vector<at::Tensor>& values);
STRATA_API int64_t host_read_count();  // calls of read_on_host in this process so far

using StepHook = std::function<void(StepContext&)>;
using StageFn = std::function<void(StepContext&)>;
// A wrapper receives the context and the stage as it was before the wrapper was added.
using StageWrapper = std::function<void(StepContext&, const StageFn& inner)>;

namespace detail {
struct StepProgramState;  // the class's state, defined in core
}  // namespace detail

// Its state lives in core (one pointer here): the class's size never changes.
class STRATA_API StepProgram {
 public:
  StepProgram();
  ~StepProgram();
  StepProgram(StepProgram&&) noexcept;
  StepProgram& operator=(StepProgram&&) noexcept;

  // Core's implementation of a stage, with a line saying what it does.
  void provide(Stage stage, std::string description, StageFn fn);
  // Replaces core's implementation. Only the pass being applied may call it, for a stage it
  // declared it owns; a second owner is an error.
  void own(Stage stage, StageFn fn);
  // Runs `wrapper` around the stage. Only for a stage the applying pass declared it wraps.
  void wrap(Stage stage, StageWrapper wrapper);
  void run(Stage stage, StepContext& context) const;

  // ABI 1.1. A figure of the step left where it was computed (a tensor of one element, on the
  // job's device), for the step's metrics: core reads it to the host with the step's loss and
  // gradient norm, only on steps that record figures (on a GPU each read waits for the device's
  // queue to drain), and adds it to the step's figures as one in StepContext::metrics. A pass
  // reports a device-side figure here instead of reading it itself.
  void report_device_figure(std::string name, at::Tensor value);
  // Core: the device figures reported since the last call, in order.
  std::vector<std::pair<std::string, at::Tensor>> take_device_figures();

  // ABI 1.4. A loss scale kept on the job's device (amp's fp16 scaler), so that the host never
  // reads it: a 0-dim float tensor, registered once when the pass applies and updated in place
  // by its owner between steps. Every backward of a step runs on loss * StepContext::loss_scale
  // * this tensor, auxiliary losses (nn::add_auxiliary_loss) included. Undefined: none.
  void set_device_loss_scale(at::Tensor scale);
  at::Tensor device_loss_scale() const;
  // ABI 1.4. A flag on the job's device (one element; nonzero skips): the step's optimizer update
  // is skipped where it is set, decided on the device. Registered once; its owner sets it in
  // every step before the update (amp: the gradients' non-finite check). Core hands it to an
  // optimizer that is a GatedOptimizer (strata/optimizer.h); for any other optimizer core reads
  // it on the host (one counted read_on_host). It keeps its value until the owner's next step,
  // so an AfterStep hook may consult it too.
  void add_skip_flag(at::Tensor flag);
  // The registered flags as one (the flag itself when there is one, else 1 where any is
  // nonzero); undefined when none is registered.
  at::Tensor skip_flag() const;

  // Who provides each stage ("core: ..." or the owning pass) and its wrappers, innermost first.
  std::string provider(Stage stage) const;
  std::vector<std::string> wrappers(Stage stage) const;

  // Set by core around each pass's apply(): the pass's name and its declared claims.
  void begin_pass(std::string name, Claims claims);
  void end_pass();

 private:
  std::unique_ptr<detail::StepProgramState> state_;
};

}  // namespace strata
