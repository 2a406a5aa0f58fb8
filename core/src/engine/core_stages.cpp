// Core's step program (core_stages.h).
#include "core_stages.h"

#include <algorithm>

#include <ATen/ATen.h>

#include "strata/core/step_plan.h"
#include "strata/errors.h"
#include "strata/ops.h"

namespace strata::engine {
namespace {

// A host batch onto the job's device without waiting: a copy from pageable memory first waits
// for everything queued on the device (a drained queue every step), one from pinned memory is
// queued like a kernel (the pinned block is not reused before the copy has run).
at::Tensor to_device(const at::Tensor& host, c10::Device device) {
  if (device.is_cpu()) return host;
  return host.pin_memory().to(device, /*non_blocking=*/true);
}

}  // namespace

void provide_core_step(Job& job, BatchSampler& sampler, const std::unique_ptr<Optimizer>& optimizer, BatchShape shape) {
  const int64_t seq_len = job.model->seq_len(), micro_batch = shape.micro_batch, micro_count = shape.micro_count;
  const int64_t dp = job.topology->size(Dim::Data), dp_rank = job.topology->rank_in(Dim::Data);
  const c10::Device device = job.device();
  job.loss = [vocab = job.model->vocab_size()](const at::Tensor& logits, const at::Tensor& targets) {
    return ops::cross_entropy(logits.reshape({-1, vocab}), targets.reshape(-1));
  };
  job.reduce_loss = [&job](const at::Tensor& local_loss) {
    // Scalars go through the communicator on the job's device (nccl takes device tensors only).
    // Context ranks hold equal shares of each sequence's tokens: the mean of their means is the
    // mean over all tokens. Alone in the group there is nothing to average (and no copy to make).
    Communicator& group = job.topology->group({Dim::Data, Dim::Context});
    if (group.size() == 1) return local_loss;
    at::Tensor mean = local_loss.to(job.device(), at::kDouble, /*non_blocking=*/false, /*copy=*/true);
    group.all_reduce(mean, ReduceOp::Avg)->wait();
    return mean;
  };
  // Packed documents: the bundled datasets declare [data] document_end and reset_positions.
  const Config& data_cfg = job.data_config();
  const int64_t document_end = data_cfg.has("document_end") ? data_cfg.get_int("document_end") : -1;
  const bool reset_positions = data_cfg.has("reset_positions") && data_cfg.get_bool("reset_positions");
  if (reset_positions && document_end < 0)
    throw UserError("[data] reset_positions = true needs document_end (the token that ends each document)");
  job.split_batch = [seq_len, document_end, reset_positions](const at::Tensor& batch) {
    MicroBatch micro{batch.narrow(1, 0, seq_len), batch.narrow(1, 1, seq_len), {}};
    micro.sequence = nn::packed_sequence(micro.inputs, document_end, reset_positions);
    return micro;
  };
  // The loss of one batch of [B, seq_len + 1] tokens: what training and evaluation both run.
  auto batch_loss = [&job](const at::Tensor& batch) {
    const MicroBatch micro = job.split_batch(batch);
    const nn::SequenceScope sequence(micro.sequence);
    return job.loss(job.model->forward(micro.inputs), micro.targets);
  };
  // Every parameter's gradient, placed as its parameter (as passes left it: expert parallel
  // splits experts after this point); stages hold disjoint parameters.
  job.local_gradients = [&job] {
    const Placements placements = nn::parameter_placements(*job.model);
    std::vector<LocalGradient> grads;
    for (const auto& p : job.model->named_parameters()) {
      const auto placement = placements.find(p.key());
      grads.push_back({p.value().grad(), nest(placement == placements.end() ? Placement{} : placement->second, 0, {Dim::Pipeline})});
    }
    return grads;
  };

  job.validation_batch = [&sampler, micro_batch, device](int64_t index) {
    return to_device(sampler.val_batch(index * micro_batch, micro_batch), device);
  };

  StepProgram& program = job.program;
  // Every data-parallel rank reads the same global batch and trains on its own slice of it, so
  // the samples of a step do not depend on the world size.
  program.provide(Stage::PrepareBatches, core_stage_description(Stage::PrepareBatches),
                  [&sampler, dp, dp_rank, micro_batch, micro_count, device](StepContext& context) {
                    context.batches.clear();
                    for (int64_t micro = 0; micro < micro_count; ++micro)
                      context.batches.push_back(
                          to_device(sampler.next_train(micro_batch * dp).narrow(0, dp_rank * micro_batch, micro_batch), device));
                  });
  program.provide(Stage::Gradients, core_stage_description(Stage::Gradients), [&program](StepContext& context) {
    program.run(Stage::ForwardBackward, context);
    program.run(Stage::SyncGradients, context);
  });
  // Dropout masks keyed by (step, micro-batch, data rank, block): a pipeline's stages draw them alike.
  const auto seed = static_cast<uint64_t>(job.job_config().get_int("seed"));
  program.provide(Stage::ForwardBackward, core_stage_description(Stage::ForwardBackward),
                  [&job, batch_loss, seed, dp_rank, &program](StepContext& context) {
                    // Summed where the losses live and left there: the trainer reads it with the
                    // step's other figures at its end (on a GPU a read here would wait for the
                    // backward). fp64, as the host's sum was, so the logged loss is unchanged.
                    at::Tensor loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(job.device()));
                    const int64_t count = static_cast<int64_t>(context.batches.size());
                    for (int64_t micro = 0; micro < count; ++micro) {
                      context.micro = micro;
                      const nn::MicroBatchRandomness randomness(seed, context.step, micro, dp_rank);
                      job.run_hooks(HookPoint::BeforeForward, context);
                      context.loss = batch_loss(context.batches[static_cast<size_t>(micro)]);
                      job.run_hooks(HookPoint::AfterForward, context);
                      context.last_backward = micro + 1 == count;
                      job.run_hooks(HookPoint::BeforeBackward, context);
                      const double weight = context.loss_scale / static_cast<double>(count);
                      const nn::LossGradientScale auxiliary_losses(weight);
                      at::Tensor scaled = context.loss * weight;
                      if (const at::Tensor scale = program.device_loss_scale(); scale.defined()) scaled = scaled * scale;
                      scaled.backward();
                      job.run_hooks(HookPoint::AfterBackward, context);
                      context.last_backward = false;
                      loss_sum += context.loss.detach().to(loss_sum.device(), at::kDouble);
                    }
                    context.local_loss = loss_sum / static_cast<double>(count);
                  });
  program.provide(Stage::SyncGradients, core_stage_description(Stage::SyncGradients), [](StepContext&) {});
  program.provide(Stage::ClipGradients, core_stage_description(Stage::ClipGradients),
                  [&job, max_norm = job.optimizer_config().get_float("grad_clip")](StepContext& context) {
                    // Every piece counted once over the mesh, whatever its placement.
                    context.grad_norm = clip_gradient_norm(job.local_gradients(), max_norm, job.topology.get(), job.device());
                  });
  program.provide(Stage::OptimizerStep, core_stage_description(Stage::OptimizerStep), [&optimizer, &program](StepContext& context) {
    if (context.skip_step) return;
    const at::Tensor skip = program.skip_flag();
    if (!skip.defined()) return optimizer->step(context.lr);
    // A pass's flag on the device: a gated optimizer decides there; any other needs it here.
    if (auto* gated = dynamic_cast<GatedOptimizer*>(optimizer.get())) return gated->step_unless(context.lr, skip);
    if (read_on_host({skip})[0] == 0) optimizer->step(context.lr);
  });
  program.provide(Stage::Evaluate, core_stage_description(Stage::Evaluate),
                  [&job, batch_loss](StepContext& context) {
                    // Summed where the losses are (fp64, as a host sum would), then one counted read.
                    at::Tensor total;
                    const int64_t batches = job.job_config().get_int("eval_batches");
                    for (int64_t b = 0; b < batches; ++b) {
                      const at::Tensor loss = batch_loss(job.validation_batch(b)).detach().to(at::kDouble);
                      total = total.defined() ? total + loss : loss;
                    }
                    context.val_loss = read_on_host({total})[0] / static_cast<double>(batches);
                  });
}

std::vector<ParamGroup> parameter_groups(const nn::Model& model, const Config& optimizer) {
  const double decay = optimizer.get_float("weight_decay");
  const bool decay_all = optimizer.get_bool("decay_norms_and_biases");
  std::vector<std::string> decayed = model.decayed_parameter_names();
  ParamGroup with_decay{{}, {}, decay}, without_decay{{}, {}, 0.0};
  for (const auto& p : model.named_parameters()) {
    bool decays = decay_all || std::find(decayed.begin(), decayed.end(), p.key()) != decayed.end();
    ParamGroup& group = decays ? with_decay : without_decay;
    group.names.push_back(p.key());
    group.params.push_back(p.value());
  }
  return {with_decay, without_decay};
}

}  // namespace strata::engine
