#include "stage_runtime.h"

#include <chrono>
#include <optional>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>


namespace strata::pipeline {

namespace {
// Message tags: a header (dtype and shape) then the tensor, per micro-batch and chunk; the header
// only the first time (StageRuntime::MessageLayout).
// Each kind has 5000 tags; a micro-batch and chunk picks one (tags repeat only 5000 apart, and
// messages with equal tags between two ranks match in order anyway).
// The tied weight and its gradient go with headers too: the two stages may hold it in different
// dtypes (fsdp under amp gathers the head's copy in bf16 while the embedding's weight is fp32),
// and a raw receive of another size corrupted memory.
constexpr int kActivationHeader = 0, kActivation = 5000, kGradientHeader = 10000, kGradient = 15000, kTiedWeight = 20000,
              kTiedGradient = 20001, kTiedWeightHeader = 20002, kTiedGradientHeader = 20003;
constexpr int kMaxDims = 8;

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point start) { return std::chrono::duration<double, std::milli>(Clock::now() - start).count(); }
}  // namespace

StageRuntime::StageRuntime(Job& job, StageLayout layout, std::vector<Action> program, std::optional<TiedWeight> tied)
    : job_(job), layout_(std::move(layout)), program_(std::move(program)), tied_(std::move(tied)),
      group_(job.topology->group(Dim::Pipeline)) {
  const int last_chunk = layout_.shape.chunks - 1;
  for (size_t i = 0; i < program_.size(); ++i) {
    const Action& a = program_[i];
    if (a.kind != ActionKind::Backward && a.kind != ActionKind::BackwardInput) continue;
    last_backward_index_ = static_cast<long>(i);
    if (tied_ && tied_->copy.defined() && a.chunk == last_chunk && last_stage(a.chunk)) tied_gradient_send_after_ = static_cast<long>(i);
    if (tied_ && tied_->parameter.defined() && a.chunk == 0 && first_stage(0)) tied_gradient_receive_before_ = static_cast<long>(i);
  }
}

void StageRuntime::install_tied_weight_hooks() {
  if (!tied_) return;
  const int last_rank = layout_.shape.ranks - 1;
  if (tied_->parameter.defined())
    // After the embedding's forward its weight is at hand even under fsdp (whose hooks, added
    // later, free it after this one).
    job_.model->add_post_forward_hook(tied_->owner_block, [this, last_rank](nn::Block&, const at::Tensor&) {
      if (!send_tied_weight_) return;
      send_tied_weight_ = false;
      send(tied_->parameter.detach().clone(), last_rank, kTiedWeightHeader, kTiedWeight, at::Tensor());
    });
  if (tied_->copy.defined())
    job_.model->add_pre_forward_hook(tied_->reader_block, [this](nn::Block&, const at::Tensor&) {
      if (!receive_tied_weight_) return;
      receive_tied_weight_ = false;
      double waited_ms = 0;
      const at::Tensor weight = receive(0, kTiedWeightHeader, kTiedWeight, at::Tensor(), waited_ms);
      at::NoGradGuard no_grad;
      tied_->copy.copy_(weight);  // in the copy's own dtype
    });
}

StageRuntime::MessageKey StageRuntime::message_key(int header_tag, const at::Tensor& batch) const {
  return {evaluating_, header_tag, batch.defined() ? batch.sizes().vec() : std::vector<int64_t>{}};
}

void StageRuntime::send(const at::Tensor& tensor, int peer, int header_tag, int tag, const at::Tensor& batch) {
  const at::Tensor body = tensor.detach().contiguous();
  auto& sends = header_tag < kActivation ? activation_sends_ : other_sends_;
  const MessageKey key = message_key(header_tag, batch);
  if (const auto known = sent_layouts_.find(key); known != sent_layouts_.end()) {
    // The receiver expects the layout it was told: a model whose messages change shape for the
    // same micro-batch shape would make it receive the wrong bytes, so it stops here.
    if (known->second.dtype != body.scalar_type() || known->second.sizes != body.sizes().vec())
      throw std::logic_error("pipeline: a message across stages (tag " + std::to_string(header_tag) + ") changed its dtype or shape from " +
                             std::string(c10::toString(known->second.dtype)) + " " + c10::str(known->second.sizes) + " to " +
                             std::string(c10::toString(body.scalar_type())) + " " + c10::str(body.sizes()) +
                             " for the same micro-batch shape; stage outputs must depend on the micro-batch's shape alone");
  } else {
    std::vector<int64_t> header(2 + kMaxDims, 0);
    header[0] = static_cast<int64_t>(body.scalar_type());
    header[1] = body.dim();
    for (int64_t d = 0; d < body.dim(); ++d) header[static_cast<size_t>(2 + d)] = body.size(d);
    const at::Tensor h = at::tensor(header, at::kLong).to(job_.device());
    sends.emplace_back(group_.send(h, peer, header_tag), h);
    sent_layouts_[key] = {body.scalar_type(), body.sizes().vec()};
  }
  sends.emplace_back(group_.send(body, peer, tag), body);
}

at::Tensor StageRuntime::receive(int peer, int header_tag, int tag, const at::Tensor& batch, double& waited_ms) {
  const auto start = Clock::now();
  const MessageKey key = message_key(header_tag, batch);
  auto known = received_layouts_.find(key);
  if (known == received_layouts_.end()) {
    at::Tensor h = at::empty({2 + kMaxDims}, at::TensorOptions().dtype(at::kLong).device(job_.device()));
    group_.recv(h, peer, header_tag)->wait();
    const std::vector<double> header = read_on_host({h});  // the body's dtype and shape; counted, as every read
    MessageLayout layout{static_cast<at::ScalarType>(static_cast<int>(header[0])),
                         std::vector<int64_t>(header.begin() + 2, header.begin() + 2 + static_cast<int64_t>(header[1]))};
    known = received_layouts_.emplace(key, std::move(layout)).first;
  }
  at::Tensor body = at::empty(known->second.sizes, at::TensorOptions().dtype(known->second.dtype).device(job_.device()));
  group_.recv(body, peer, tag)->wait();
  waited_ms += ms_since(start);
  return body;
}

at::Tensor StageRuntime::forward_chunk(int chunk, const at::Tensor& input, const at::Tensor& batch, StepContext* context) {
  const StageBlocks blocks = layout_.chunks[static_cast<size_t>(chunk)];
  // Every stage knows where the micro-batch's tokens sit (positions, documents, its context
  // share): its blocks may need it, not only the first.
  const MicroBatch micro = job_.split_batch(batch);
  const nn::SequenceScope sequence(micro.sequence);
  const at::Tensor x = first_stage(chunk) ? micro.inputs : input;
  // Training forwards draw dropout masks keyed by micro-batch, as core's forward-backward does, so
  // each block's masks are the ones one process draws for it.
  std::optional<nn::MicroBatchRandomness> randomness;
  if (context)
    randomness.emplace(static_cast<uint64_t>(job_.job_config().get_int("seed")), context->step, context->micro,
                       job_.topology->rank_in(Dim::Data));
  at::Tensor out = job_.model->forward_blocks(blocks.first, blocks.last, x);
  if (!last_stage(chunk)) return out;
  at::Tensor loss = job_.loss(out, micro.targets);
  if (context) context->loss = loss;
  return loss;
}

void StageRuntime::run_step(StepContext& context) {
  const auto started = Clock::now();
  const int p = layout_.shape.ranks, r = layout_.rank;
  const int64_t count = static_cast<int64_t>(context.batches.size());
  if (count != layout_.shape.micro_batches)
    throw std::logic_error("pipeline: " + std::to_string(count) + " micro-batches, the schedule has " +
                           std::to_string(layout_.shape.micro_batches));
  // Under overlap, the data-parallel reduction starts in the rank's last backward, which then
  // completes every parameter's gradient: true with one chunk per rank and whole backwards.
  const bool sync_window_in_last_backward = layout_.shape.chunks == 1 && !layout_.splits_backward;
  if (tied_ && tied_->copy.defined()) tied_->copy.mutable_grad() = at::Tensor();
  send_tied_weight_ = tied_ && tied_->parameter.defined();
  receive_tied_weight_ = tied_ && tied_->copy.defined();
  double waited_ms = 0;
  // The last stage's losses summed where they are (fp64, as a host sum would), read once with the
  // step's other figures: on a GPU a read per micro-batch would stall the schedule.
  at::Tensor loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(job_.device()));
  for (size_t i = 0; i < program_.size(); ++i) {
    const Action& a = program_[i];
    const int stage = stage_of(a.chunk);
    const int prev_rank = (stage - 1 + p) % p, next_rank = (stage + 1) % p;
    const auto key = std::make_pair(a.micro, a.chunk);
    const at::Tensor& batch = context.batches[static_cast<size_t>(a.micro)];
    context.micro = a.micro;
    switch (a.kind) {
      case ActionKind::RecvActivation:
        received_[key] = receive(prev_rank, tag(kActivationHeader, a.micro, stage), tag(kActivation, a.micro, stage), batch, waited_ms);
        break;
      case ActionKind::RecvGradient:
        received_[{-1 - a.micro, a.chunk}] =
            receive(next_rank, tag(kGradientHeader, a.micro, stage + 1), tag(kGradient, a.micro, stage + 1), batch, waited_ms);
        break;
      case ActionKind::SendActivation:
        send(in_flight_.at(key).output, next_rank, tag(kActivationHeader, a.micro, stage + 1), tag(kActivation, a.micro, stage + 1), batch);
        break;
      case ActionKind::SendGradient:
        send(in_flight_.at(key).input.grad(), prev_rank, tag(kGradientHeader, a.micro, stage), tag(kGradient, a.micro, stage), batch);
        in_flight_.erase(key);
        break;
      case ActionKind::Forward: {
        at::Tensor input;
        if (stage > 0) {
          input = received_.at(key).requires_grad_(received_.at(key).is_floating_point());
          received_.erase(key);
        }
        job_.run_hooks(HookPoint::BeforeForward, context);
        at::Tensor output = forward_chunk(a.chunk, input, batch, &context);
        job_.run_hooks(HookPoint::AfterForward, context);
        if (last_stage(a.chunk)) loss_sum += output.detach().to(loss_sum.device(), at::kDouble);
        in_flight_[key] = {input, output};
        break;
      }
      case ActionKind::Backward:
      case ActionKind::BackwardInput: {
        if (static_cast<long>(i) == tied_gradient_receive_before_) {
          const at::Tensor grad = receive(p - 1, kTiedGradientHeader, kTiedGradient, at::Tensor(), waited_ms).to(tied_->parameter.scalar_type());
          at::NoGradGuard no_grad;
          if (tied_->parameter.grad().defined())
            tied_->parameter.mutable_grad().add_(grad);
          else
            tied_->parameter.mutable_grad() = grad;
        }
        InFlight& f = in_flight_.at(key);
        context.last_backward = sync_window_in_last_backward && static_cast<long>(i) == last_backward_index_;
        job_.run_hooks(HookPoint::BeforeBackward, context);
        {
          std::optional<nn::WeightGradientQueue::Scope> deferring;
          if (a.kind == ActionKind::BackwardInput) deferring.emplace(&weight_gradients_[key]);
          const double weight = context.loss_scale / static_cast<double>(count);
          const nn::LossGradientScale auxiliary_losses(weight);  // the micro-batch's weight on every stage
          if (last_stage(a.chunk)) {
            at::Tensor scaled = f.output * weight;
            if (const at::Tensor scale = job_.program.device_loss_scale(); scale.defined()) scaled = scaled * scale;
            scaled.backward();
          } else {
            const auto grad_key = std::make_pair(-1 - a.micro, a.chunk);
            torch::autograd::backward({f.output}, {received_.at(grad_key)});
            received_.erase(grad_key);
          }
        }
        job_.run_hooks(HookPoint::AfterBackward, context);
        context.last_backward = false;
        f.output = at::Tensor();
        if (stage == 0) in_flight_.erase(key);
        // The activation sent for this micro-batch has been consumed: its gradient came back.
        if (static_cast<long>(i) == tied_gradient_send_after_) {
          send(tied_->copy.grad().defined() ? tied_->copy.grad().clone() : at::zeros_like(tied_->copy), 0, kTiedGradientHeader, kTiedGradient,
               at::Tensor());
        }
        break;
      }
      case ActionKind::BackwardWeight:
        weight_gradients_.at(key).run_all();
        weight_gradients_.erase(key);
        break;
    }
  }
  const double busy_ms = ms_since(started) - waited_ms;
  for (auto& [work, tensor] : activation_sends_) work->wait();
  for (auto& [work, tensor] : other_sends_) work->wait();
  activation_sends_.clear();
  other_sends_.clear();
  if (!sync_window_in_last_backward) open_sync_window_after_split_backward(context);
  context.local_loss = layout_.shape.virtual_stages() > 0 && last_stage(layout_.shape.chunks - 1)
                           ? loss_sum / static_cast<double>(count)
                           : at::zeros_like(loss_sum);

  // A pass may run the schedule more than once in a step (WSAM's two passes): the step's idle
  // share (report_idle) is of all of them.
  step_busy_ms_ += busy_ms;
  step_total_ms_ += ms_since(started);
  context.metrics.emplace_back("pp_wait_ms", waited_ms);
}

void StageRuntime::report_idle() {
  // Each stage's share of the step spent waiting for its neighbours, gathered over the pipeline
  // group and left on the device: core reads it with the step's other figures.
  const int p = layout_.shape.ranks;
  at::Tensor idle = at::zeros({p}, at::TensorOptions().dtype(at::kDouble));
  idle[layout_.rank] = step_total_ms_ > 0 ? 1.0 - step_busy_ms_ / step_total_ms_ : 0.0;
  step_busy_ms_ = step_total_ms_ = 0;
  idle = idle.to(job_.device());
  group_.all_reduce(idle, ReduceOp::Sum)->wait();
  for (int s = 0; s < p; ++s) job_.program.report_device_figure("pp_idle_fraction_stage" + std::to_string(s), idle[s]);
}

// With several chunks per rank, or weight gradients held back, a rank's parameters get their
// last gradient in different actions, so the gradient-sync pass's window (its hooks see each
// gradient of the step's last backward as it accumulates) cannot open inside one of them.
// It opens here instead, after every gradient is complete: one backward that adds zero to each
// parameter's gradient runs the sync hooks on the final sums. No reduction overlaps the
// backward then. That backward reads gradients only, never the parameters' values, so fsdp's
// parameters may be released (their storage freed) meanwhile: the units' full gradients, which
// accumulated over the schedule as over any micro-batch but the last, are reduce-scattered here.
void StageRuntime::open_sync_window_after_split_backward(StepContext& context) {
  const std::string provider = job_.program.provider(Stage::SyncGradients);
  if (provider.rfind("core", 0) == 0) return;  // nothing synchronises gradients
  std::vector<at::Tensor> params, zeros;
  for (const auto& p : job_.model->parameters()) {
    if (!p.requires_grad()) continue;
    params.push_back(p);
    zeros.push_back(at::zeros_like(p));
  }
  context.last_backward = true;
  job_.run_hooks(HookPoint::BeforeBackward, context);
  if (!params.empty()) torch::autograd::backward(params, zeros);
  job_.run_hooks(HookPoint::AfterBackward, context);
  context.last_backward = false;
}

void StageRuntime::evaluate(StepContext& context) {
  const int p = layout_.shape.ranks;
  const int64_t batches = job_.job_config().get_int("eval_batches");
  send_tied_weight_ = tied_ && tied_->parameter.defined();
  receive_tied_weight_ = tied_ && tied_->copy.defined();
  double waited_ms = 0;
  at::Tensor total = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(job_.device()));  // the last stage's, summed where they are
  evaluating_ = true;
  for (int64_t b = 0; b < batches; ++b) {
    const at::Tensor batch = job_.validation_batch(b);
    for (int c = 0; c < layout_.shape.chunks; ++c) {
      const int stage = stage_of(c);
      const int micro = static_cast<int>(b % 1000);
      at::Tensor input;
      if (stage > 0) input = receive((stage - 1 + p) % p, tag(kActivationHeader, micro, stage), tag(kActivation, micro, stage), batch, waited_ms);
      const at::Tensor out = forward_chunk(c, input, batch, nullptr);
      if (last_stage(c))
        total += out.detach().to(total.device(), at::kDouble);
      else
        send(out, (stage + 1) % p, tag(kActivationHeader, micro, stage + 1), tag(kActivation, micro, stage + 1), batch);
    }
    for (auto& [work, tensor] : activation_sends_) work->wait();
    activation_sends_.clear();
  }
  for (auto& [work, tensor] : other_sends_) work->wait();
  other_sends_.clear();
  evaluating_ = false;
  // The last stage has the loss; every rank reports it.
  at::Tensor loss = last_stage(layout_.shape.chunks - 1) ? total / static_cast<double>(batches) : at::zeros_like(total);
  group_.all_reduce(loss, ReduceOp::Sum)->wait();
  context.val_loss = read_on_host({loss})[0];  // counted, as every read
}

}  // namespace strata::pipeline
