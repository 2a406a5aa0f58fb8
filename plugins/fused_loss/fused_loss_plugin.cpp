// The fused_loss pass: the model's output projection and the cross-entropy computed together by
// the linear_cross_entropy operator, whose chunked CPU implementation (kernels/) never holds the
// [tokens, vocab] logits. The projection layer in the model's last block (a TiedLinear, or a
// Linear whose outputs are the vocabulary) gets a compute hook that returns its input and
// records its weight and bias; the job's loss then receives that input, the head's hidden
// states, in place of logits, and calls the operator with the recorded weight and bias. So one
// training step runs: blocks, head up to the projection, linear_cross_entropy, backward.
// Under tensor_parallel the projection holds this rank's rows of the vocabulary and the loss is
// the vocab-parallel fused one (vocab_parallel_loss.h): per chunk of rows, two all-reduces of
// per-row figures in place of the whole vocabulary's logits.
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

// The output projection: the last TiedLinear or vocabulary-wide Linear of the model's last block
// (`rows`: the vocabulary, or this rank's share of it under tensor_parallel).
nn::LayerHooks* find_projection(nn::Model& model, int64_t rows, std::string& name) {
  nn::LayerHooks* found = nullptr;
  nn::Block& head = model.block(model.num_blocks() - 1);
  for (const auto& item : head.named_modules("", /*include_self=*/false)) {
    if (auto* tied = dynamic_cast<nn::TiedLinear*>(item.value().get()); tied && tied->embedding().weight.size(0) == rows) {
      found = &tied->hooks;
      name = item.key();
    } else if (auto* linear = dynamic_cast<nn::Linear*>(item.value().get()); linear && linear->weight.size(0) == rows) {
      found = &linear->hooks;
      name = item.key();
    }
  }
  name = model.block_name(model.num_blocks() - 1) + "." + name;
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
    // tensor_parallel splits the projection by vocabulary rows (nn::shard_range) over its group.
    Communicator* tensor_group = job.topology && job.topology->size(Dim::Tensor) > 1 ? &job.topology->group(Dim::Tensor) : nullptr;
    const int64_t vocab = job.model->vocab_size();
    const nn::ShardRange columns =
        tensor_group ? nn::shard_range(vocab, nn::TensorShard{tensor_group->size(), tensor_group->rank()}) : nn::ShardRange{0, vocab};
    std::string name;
    nn::LayerHooks* hooks = find_projection(*job.model, columns.size, name);
    if (!hooks)
      throw UserError("pass 'fused_loss': the last block of model '" + job.job_config().get_string("model") +
                      "' has no output projection (a TiedLinear, or a Linear with vocab_size outputs)");
    if (hooks->compute)
      throw UserError("pass 'fused_loss': the output projection " + name +
                      " is already computed by another pass (fp8 include?); leave it to one of them");
    auto projection = std::make_shared<Projection>();
    hooks->compute = [projection](const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b) {
      projection->weight = w;
      projection->bias = b;
      return x;
    };
    const int64_t vocab_start = columns.start;
    job.loss = [projection, name, tensor_group, vocab, vocab_start](const at::Tensor& hidden, const at::Tensor& targets) {
      if (!projection->weight.defined())
        throw std::logic_error("fused_loss: the loss ran before the output projection " + name);
      const at::Tensor rows = hidden.reshape({-1, hidden.size(-1)});
      if (projection->weight.size(0) != vocab) {
        if (!tensor_group)
          throw std::logic_error("fused_loss: the output projection " + name + " has " + std::to_string(projection->weight.size(0)) +
                                 " rows, not the vocabulary's " + std::to_string(vocab) + ", and no tensor group splits it");
        return vocab_parallel_linear_cross_entropy(rows, projection->weight, projection->bias, targets.reshape(-1), vocab_start,
                                                   *tensor_group);
      }
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
