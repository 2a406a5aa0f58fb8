// The fused_loss pass: the model's output projection and the cross-entropy computed together by
// the linear_cross_entropy operator, whose chunked CPU implementation (kernels/) never holds the
// [tokens, vocab] logits. The projection layer in the model's last block (a TiedLinear, or a
// Linear whose outputs are the vocabulary) gets a compute hook that returns its input and
// records its weight and bias; the job's loss then receives that input, the head's hidden
// states, in place of logits, and calls the operator with the recorded weight and bias. So one
// training step runs: blocks, head up to the projection, linear_cross_entropy, backward.
// Under tensor_parallel the projection holds this rank's rows of the vocabulary and the loss is
// the vocab-parallel fused one (vocab_parallel_loss.h): per chunk of rows, two all-reduces of
// per-row figures in place of the whole vocabulary's logits. A head tensor_parallel keeps whole
// (a program's own model may) gets the whole-vocabulary operator on every tensor rank.
#include <iostream>

#include "strata/plugin.h"
#include "vocab_parallel_loss.h"

namespace strata::fused_loss {
namespace {

// The projection's weight and bias as its last forward saw them (after its on_input/on_weight
// hooks): what the loss multiplies the hidden states with.
struct Projection {
  at::Tensor weight;
  std::optional<at::Tensor> bias;
};

// The output projection: the last TiedLinear or vocabulary-wide Linear of the model's last block,
// and the rows of the vocabulary it holds here: all of them, or this rank's share when
// tensor_parallel split it by rows (a Column layer; a program's own model may keep its head whole).
struct FoundProjection {
  nn::LayerHooks* hooks = nullptr;
  std::string name;
  nn::TensorShard shard;  // parts > 1: split by vocabulary rows
  nn::ShardRange rows;
};

FoundProjection find_projection(nn::Model& model, int64_t vocab) {
  FoundProjection found;
  nn::Block& head = model.block(model.num_blocks() - 1);
  const auto held = [&](nn::ParallelStyle style, nn::TensorShard shard) {
    found.shard = style == nn::ParallelStyle::Column && shard.parts > 1 ? shard : nn::TensorShard{};
    found.rows = found.shard.parts > 1 ? nn::shard_range(vocab, found.shard) : nn::ShardRange{0, vocab};
  };
  for (const auto& item : head.named_modules("", /*include_self=*/false)) {
    if (auto* tied = dynamic_cast<nn::TiedLinear*>(item.value().get()); tied && tied->embedding().count == vocab) {
      found.hooks = &tied->hooks;
      found.name = item.key();
      held(tied->embedding().parallel_style, tied->embedding().shard);
    } else if (auto* linear = dynamic_cast<nn::Linear*>(item.value().get()); linear && linear->out_features == vocab) {
      found.hooks = &linear->hooks;
      found.name = item.key();
      held(linear->parallel_style, linear->shard);
    }
  }
  found.name = model.block_name(model.num_blocks() - 1) + "." + found.name;
  return found;
}

class FusedLossPass final : public Pass {
 public:
  FusedLossPass()
      : Pass({ComponentKind::Pass, "fused_loss",
              "The output projection and the cross-entropy in one operator (linear_cross_entropy): on the CPU, in chunks of "
              "rows, without the [tokens, vocab] logits",
              Schema()},
             // After tensor_parallel, whose vocab-parallel loss this one replaces. Under fsdp
             // the unit that ends the model stays gathered through the loss; under
             // pipeline_parallel the last stage's head copy of a tied weight is the one the hook
             // records.
             {Phase::ModelRewrite, {}, {}, {"fp8", "module_replace", "tensor_parallel"}, {}}) {}

  void apply(Job& job, const Config&) const override {
    // Under pipeline_parallel only the last stage holds the head and computes the loss; the
    // other stages keep their blocks as they are.
    const bool pipelined = job.topology && job.topology->size(Dim::Pipeline) > 1;
    if (pipelined && job.topology->rank_in(Dim::Pipeline) != job.topology->size(Dim::Pipeline) - 1) return;
    const FoundProjection found = find_projection(*job.model, job.model->vocab_size());
    const std::string& name = found.name;
    if (!found.hooks)
      throw UserError("pass 'fused_loss': the last block of model '" + job.job_config().get_string("model") +
                      "' has no output projection (a TiedLinear, or a Linear with vocab_size outputs)");
    if (found.hooks->compute)
      throw UserError("pass 'fused_loss': the output projection " + name +
                      " is already computed by another pass (fp8 include?); leave it to one of them");
    // Split by rows over the tensor group: the vocab-parallel loss over that group.
    Communicator* tensor_group = nullptr;
    if (found.shard.parts > 1) {
      tensor_group = job.topology && job.topology->size(Dim::Tensor) == found.shard.parts ? &job.topology->group(Dim::Tensor) : nullptr;
      if (!tensor_group || tensor_group->rank() != found.shard.index)
        throw std::logic_error("fused_loss: the output projection " + name + " is split in " + std::to_string(found.shard.parts) +
                               " parts, not over the tensor group");
    }
    auto projection = std::make_shared<Projection>();
    found.hooks->compute = [projection](const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b) {
      projection->weight = w;
      projection->bias = b;
      return x;
    };
    const int64_t vocab_start = found.rows.start;
    job.loss = [projection, name, tensor_group, vocab_start](const at::Tensor& hidden, const at::Tensor& targets) {
      if (!projection->weight.defined())
        throw std::logic_error("fused_loss: the loss ran before the output projection " + name);
      const at::Tensor rows = hidden.reshape({-1, hidden.size(-1)});
      if (tensor_group)
        return vocab_parallel_linear_cross_entropy(rows, projection->weight, projection->bias, targets.reshape(-1), vocab_start,
                                                   *tensor_group);
      return ops::linear_cross_entropy(rows, projection->weight, projection->bias, targets.reshape(-1));
    };
    // One line from the first rank that holds the head.
    const bool first_with_head = !job.topology || (job.topology->rank_in({Dim::Data, Dim::Tensor, Dim::Context}) == 0);
    if (first_with_head)
      std::cout << "fused_loss: " << name << " and the cross entropy computed by "
                << (tensor_group ? "the vocab-parallel chunked loss over " + std::to_string(tensor_group->size()) + " tensor ranks"
                                 : ops::select(ops::LinearCrossEntropy::name, job.model->parameters().front()).name())
                << "\n";
  }
};

void register_components(Registry& registry) { registry.add(std::make_unique<FusedLossPass>()); }

}  // namespace
}  // namespace strata::fused_loss

STRATA_PLUGIN("fused_loss", "0.1.0", strata::fused_loss::register_components)
