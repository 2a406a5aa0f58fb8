// Activation checkpointing: selected blocks run without keeping their intermediate activations;
// backward runs the block's forward again (with the random number generators rewound, so
// dropout draws the same masks, and under the autocast state the forward saw, so amp recomputes
// in the same dtypes) and differentiates that. Only each block's input is kept.
#include <algorithm>
#include <atomic>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "../common/block_selectors.h"
#include "strata/plugin.h"
#include "strata/rng.h"

namespace strata::act_checkpoint {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::vector<at::Tensor> trainable_parameters(nn::Block& block) {
  std::vector<at::Tensor> out;
  for (const auto& p : block.parameters())
    if (p.requires_grad()) out.push_back(p);
  return out;
}

// Restores a device's autocast switch and dtype when it goes out of scope, and drops the casts
// autocast cached meanwhile: they hold parameter values the next optimizer step makes stale.
class AutocastState {
 public:
  explicit AutocastState(c10::DeviceType device)
      : device_(device), enabled_(at::autocast::is_autocast_enabled(device)), dtype_(at::autocast::get_autocast_dtype(device)) {}
  ~AutocastState() {
    at::autocast::set_autocast_enabled(device_, enabled_);
    at::autocast::set_autocast_dtype(device_, dtype_);
    at::autocast::clear_cache();
  }
  AutocastState(const AutocastState&) = delete;
  AutocastState& operator=(const AutocastState&) = delete;

 private:
  c10::DeviceType device_;
  bool enabled_;
  at::ScalarType dtype_;
};

std::optional<at::Tensor> optional(const at::Tensor& t) { return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt; }

class Recompute : public torch::autograd::Function<Recompute> {
 public:
  static nn::SequenceLayout saved_sequence(AutogradContext* ctx) {
    const auto tensors = ctx->saved_data["sequence_tensors"].toOptionalTensorList();
    auto get = [&](size_t i) { return tensors.get(i).value_or(at::Tensor()); };
    nn::SequenceLayout sequence;
    sequence.window = ctx->saved_data["sequence_window"].toInt();
    sequence.token_index = get(0);
    sequence.positions = get(1);
    sequence.documents = get(2);
    return sequence;
  }

  // `params` are the block's parameters: passed as a TensorList, each one is an input of this
  // node, so their gradients flow through it.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, nn::Block* block, std::atomic<int64_t>* recomputed,
                            at::TensorList params) {
    ctx->saved_data["block"] = reinterpret_cast<int64_t>(block);
    ctx->saved_data["recomputed"] = reinterpret_cast<int64_t>(recomputed);
    // The running block's name and type (the model's strings, which outlive the step), so the
    // recomputation selects the same operator implementations (pins per block) as the forward.
    ctx->saved_data["block_name"] = reinterpret_cast<int64_t>(&ops::BlockScope::name());
    ctx->saved_data["block_type"] = reinterpret_cast<int64_t>(&ops::BlockScope::type());
    ctx->saved_data["rng"] = c10::List<at::Tensor>(RngSnapshot(x.device()).states());
    ctx->saved_data["autocast"] = at::autocast::is_autocast_enabled(x.device().type());
    ctx->saved_data["autocast_dtype"] = at::autocast::get_autocast_dtype(x.device().type());
    // Where the micro-batch's tokens sit (positions, documents, context-parallel share): the
    // recomputation runs in backward, after the forward's nn::SequenceScope has closed.
    const nn::SequenceLayout& sequence = nn::current_sequence();
    ctx->saved_data["sequence_window"] = sequence.window;
    ctx->saved_data["sequence_tensors"] = c10::List<std::optional<at::Tensor>>(
        {optional(sequence.token_index), optional(sequence.positions), optional(sequence.documents)});
    ctx->save_for_backward({x});
    return block->forward(x);  // autograd is off inside Function::forward: nothing is recorded
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    auto* block = reinterpret_cast<nn::Block*>(ctx->saved_data["block"].toInt());
    // Replay the forward's random numbers, then leave the generators where backward found them.
    const RngSnapshot now(x.device());
    RngSnapshot(x.device(), ctx->saved_data["rng"].toTensorVector()).restore();
    at::Tensor input = x.detach().requires_grad_(x.requires_grad());
    at::Tensor output;
    {
      const c10::DeviceType device = x.device().type();
      const AutocastState outside(device);
      at::autocast::set_autocast_enabled(device, ctx->saved_data["autocast"].toBool());
      at::autocast::set_autocast_dtype(device, ctx->saved_data["autocast_dtype"].toScalarType());
      at::AutoGradMode enable(true);
      const ops::BlockScope scope(*reinterpret_cast<const std::string*>(ctx->saved_data["block_name"].toInt()),
                                  *reinterpret_cast<const std::string*>(ctx->saved_data["block_type"].toInt()));
      const nn::SequenceScope sequence(saved_sequence(ctx));
      output = block->forward(input);
    }
    now.restore();
    ++*reinterpret_cast<std::atomic<int64_t>*>(ctx->saved_data["recomputed"].toInt());

    variable_list wrt;
    if (input.requires_grad()) wrt.push_back(input);
    std::vector<at::Tensor> params = trainable_parameters(*block);
    for (const auto& p : params) wrt.push_back(p);
    variable_list grads = torch::autograd::grad({output}, wrt, {grad_outputs[0]}, /*retain_graph=*/false,
                                                /*create_graph=*/false, /*allow_unused=*/true);
    // One gradient per forward input: x, the block and counter pointers (none), each parameter.
    variable_list out;
    size_t next = 0;
    out.push_back(input.requires_grad() ? grads[next++] : at::Tensor());
    out.push_back(at::Tensor());
    out.push_back(at::Tensor());
    for (size_t i = 0; i < params.size(); ++i) out.push_back(grads[next++]);
    return out;
  }
};

class ActCheckpointPass final : public Pass {
 public:
  // Before fsdp so that recomputation happens inside a unit, after its all-gather.
  ActCheckpointPass()
      : Pass({ComponentKind::Pass, "act_checkpoint", "Recompute activations of selected blocks during backward",
              Schema()
                  .strings("blocks", {"block"}, "Block types or names to checkpoint")
                  .integer("every", 1, "Checkpoint every k-th matching block", at_least(1))
                  .tuned({int64_t{1}, int64_t{2}})},
             {Phase::Wrapping, {}, {}, {}, {"fsdp", "ddp", "zero1", "zero2"}}) {}

  // Exact, and a trade of time for memory: strata tune tries it on and off.
  TuneUse tune_use() const override { return TuneUse::Try; }

  // A checkpointed layer keeps only its input ([s, b, h]) and recomputes its forward in backward
  // (one layer's activations alive at a time); 1 of every `every` layers is checkpointed.
  void estimate(const Config& config, const PlanFacts&, CostEstimate& c) const override {
    if (c.layers_per_rank <= 0) return;
    const double share = 1.0 / static_cast<double>(config.get_int("every"));
    const double per_layer = c.activation_bytes / c.layers_per_rank;
    const double input = c.seq_per_rank * static_cast<double>(c.micro_batch) * static_cast<double>(c.model.hidden) * c.activation_element_bytes;
    c.activation_bytes = (1 - share) * c.activation_bytes + share * c.layers_per_rank * input;
    c.transient_bytes += per_layer;
    c.flops *= 1 + share / 3;  // a forward is a third of forward + backward
    c.messages *= 1 + share / 3;  // the recomputed forward repeats the model-parallel collectives
  }

  void apply(Job& job, const Config& config) const override {
    // An entry naming no block on any rank is a typo that would keep those blocks' activations: refused.
    block_selectors::refuse_unmatched(job, "act_checkpoint", "blocks", config.get_strings("blocks"));
    std::vector<size_t> matching = job.model->find_blocks(config.get_strings("blocks"));
    // A pipeline stage may hold no matching block (the stage of the embedding alone): only a
    // selector that no stage matches is an error, found by every stage together.
    double matched = static_cast<double>(matching.size());
    if (job.topology->size(Dim::Pipeline) > 1) {
      at::Tensor count = at::full({1}, matched, at::kDouble);
      job.topology->group(Dim::Pipeline).all_reduce(count, ReduceOp::Sum)->wait();
      matched = count.item<double>();
    }
    if (matched == 0)
      throw UserError("pass 'act_checkpoint': no block of the model matches blocks = [" + block_selectors::quoted_list(config.get_strings("blocks")) + "]");
    const auto every = static_cast<size_t>(config.get_int("every"));
    // Counts recomputations, reported per step as "recomputed_blocks" in metrics.jsonl.
    auto recomputed = std::make_shared<std::atomic<int64_t>>(0);
    for (size_t k = 0; k < matching.size(); k += every)
      job.model->set_executor(matching[k], [recomputed](nn::Block& block, const at::Tensor& x) {
        // Nothing to save memory for without autograd (evaluation) or without parameters.
        if (!at::GradMode::is_enabled()) return block.forward(x);
        const std::vector<at::Tensor> params = trainable_parameters(block);
        return Recompute::apply(x, &block, recomputed.get(), at::TensorList(params));
      });
    job.add_hook(HookPoint::AfterStep, [recomputed](StepContext& context) {
      context.metrics.emplace_back("recomputed_blocks", static_cast<double>(recomputed->exchange(0)));
    });
  }
};

void register_components(Registry& registry) { registry.add(std::make_unique<ActCheckpointPass>()); }

}  // namespace
}  // namespace strata::act_checkpoint

STRATA_PLUGIN("act_checkpoint", "0.2.0", strata::act_checkpoint::register_components)
