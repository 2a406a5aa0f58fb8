// Runs this rank's list of pipeline actions for one step (and a forward-only pass for
// evaluation): forwards and backwards of its chunks, the messages between ranks, tied weights
// between the first and last stage, and the data-parallel gradient sync window.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "partition.h"
#include "strata/job.h"
#include "strata/pipeline.h"

namespace strata::pipeline {

// The embedding weight that the first stage owns and the last stage's head reads (tied
// embeddings). The last stage holds a copy outside its parameters: the first stage sends the
// weight once per step and evaluation, on the embedding's first forward; the last stage sends its
// copy's gradient back after its last backward through the head, which the first stage adds
// before its own last backward through the embedding (so the data-parallel reduction that starts
// there sees the sum).
struct TiedWeight {
  at::Tensor parameter;  // on the first stage: the embedding's weight
  at::Tensor copy;       // on the last stage: the head's view of it
  size_t owner_block = 0, reader_block = 0;  // in this rank's stage model
};

struct StageLayout {
  ScheduleShape shape;
  int rank = 0;                      // pipeline rank
  std::vector<StageBlocks> chunks;   // this rank's chunks, blocks in its stage model
  bool splits_backward = false;      // the program has input/weight halves
  std::string schedule;
};

class StageRuntime {
 public:
  StageRuntime(Job& job, StageLayout layout, std::vector<Action> program, std::optional<TiedWeight> tied);

  void run_step(StepContext& context);  // the forward_backward stage
  void evaluate(StepContext& context);  // the evaluate stage
  void report_idle();                   // after the step: each stage's idle share of it
  // Installs the model hooks that move the tied weight (call once, before other passes hook).
  void install_tied_weight_hooks();

 private:
  struct InFlight {
    at::Tensor input, output;  // output is the loss on the last stage
  };
  int stage_of(int chunk) const { return chunk * layout_.shape.ranks + layout_.rank; }
  bool first_stage(int chunk) const { return stage_of(chunk) == 0; }
  bool last_stage(int chunk) const { return stage_of(chunk) == layout_.shape.virtual_stages() - 1; }
  // The tag of a message of `micro` across the boundary into virtual stage `boundary` (from
  // boundary - 1): the same on both sides.
  int tag(int base, int micro, int boundary) const { return base + (micro * layout_.shape.virtual_stages() + boundary) % 5000; }

  // A message's body goes with a header (its dtype and shape) only the first time its kind of
  // message crosses for a micro-batch of that shape: the receiver reads the header on the host
  // (a wait for the device on a GPU) and keeps the layout; later ones reuse it, so a step reads
  // nothing. Both sides key the layout by the same things: the phase, the header tag and the
  // micro-batch's shape (every stage holds the micro-batch). `batch` is undefined for the tied
  // weight and its gradient, whose layout is fixed for the run.
  struct MessageLayout {
    at::ScalarType dtype;
    std::vector<int64_t> sizes;
  };
  using MessageKey = std::tuple<bool, int, std::vector<int64_t>>;  // evaluating, header tag, micro-batch shape
  MessageKey message_key(int header_tag, const at::Tensor& batch) const;
  at::Tensor receive(int peer, int header_tag, int tag, const at::Tensor& batch, double& waited_ms);
  void send(const at::Tensor& tensor, int peer, int header_tag, int tag, const at::Tensor& batch);
  at::Tensor forward_chunk(int chunk, const at::Tensor& input, const at::Tensor& batch, StepContext* context);
  void open_sync_window_after_split_backward(StepContext& context);

  Job& job_;
  StageLayout layout_;
  std::vector<Action> program_;
  std::optional<TiedWeight> tied_;
  Communicator& group_;
  std::map<std::pair<int, int>, InFlight> in_flight_;        // (micro, chunk)
  std::map<std::pair<int, int>, at::Tensor> received_;       // inputs and output gradients waiting for their compute
  std::map<std::pair<int, int>, nn::WeightGradientQueue> weight_gradients_;
  std::vector<std::pair<WorkPtr, at::Tensor>> activation_sends_, other_sends_;
  bool send_tied_weight_ = false, receive_tied_weight_ = false;
  bool evaluating_ = false;  // in evaluate(): its messages have their own layouts
  std::map<MessageKey, MessageLayout> sent_layouts_, received_layouts_;
  long last_backward_index_ = -1, tied_gradient_send_after_ = -1, tied_gradient_receive_before_ = -1;
  // Busy and total time of the schedule's runs in this step (report_idle).
  double step_busy_ms_ = 0, step_total_ms_ = 0;
};

}  // namespace strata::pipeline
