// The fused_loss pass: the model's output projection and the cross-entropy computed together by
// the linear_cross_entropy operator, whose chunked CPU implementation (kernels/) never holds the
// [tokens, vocab] logits. The projection layer in the model's last block (a TiedLinear, or a
// Linear whose outputs are the vocabulary) gets a compute hook that returns its input and
// records its weight and bias; the job's loss then receives that input, the head's hidden
// states, in place of logits, and calls the operator with the recorded weight and bias. So one
// training step runs: blocks, head up to the projection, linear_cross_entropy, backward.
#include <iostream>

#include "strata/plugin.h"

namespace strata::fused_loss {
namespace {

// The projection's weight and bias as its last forward saw them (after its on_input/on_weight
// hooks): what the loss multiplies the hidden states with.
struct Projection {
  at::Tensor weight;
  std::optional<at::Tensor> bias;
};

// The output projection: the last TiedLinear or vocabulary-wide Linear of the model's last block.
nn::LayerHooks* find_projection(nn::Model& model, std::string& name) {
  nn::LayerHooks* found = nullptr;
  nn::Block& head = model.block(model.num_blocks() - 1);
  for (const auto& item : head.named_modules("", /*include_self=*/false)) {
    if (auto* tied = dynamic_cast<nn::TiedLinear*>(item.value().get());
        tied && tied->embedding().weight.size(0) == model.vocab_size()) {
      found = &tied->hooks;
      name = item.key();
    } else if (auto* linear = dynamic_cast<nn::Linear*>(item.value().get()); linear && linear->weight.size(0) == model.vocab_size()) {
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
             // tensor_parallel computes a vocabulary-parallel loss on split logits, which
             // linear_cross_entropy does not (docs/performance.md). Under fsdp the unit that
             // ends the model stays gathered through the loss; under pipeline_parallel the last
             // stage's head copy of a tied weight is the one the hook records.
             {Phase::ModelRewrite, {}, {"tensor_parallel"}, {"fp8", "module_replace"}, {}}) {}

  void apply(Job& job, const Config&) const override {
    // Under pipeline_parallel only the last stage holds the head and computes the loss; the
    // other stages keep their blocks as they are.
    const bool pipelined = job.topology && job.topology->size(Dim::Pipeline) > 1;
    if (pipelined && job.topology->rank_in(Dim::Pipeline) != job.topology->size(Dim::Pipeline) - 1) return;
    std::string name;
    nn::LayerHooks* hooks = find_projection(*job.model, name);
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
    job.loss = [projection, name](const at::Tensor& hidden, const at::Tensor& targets) {
      if (!projection->weight.defined())
        throw std::logic_error("fused_loss: the loss ran before the output projection " + name);
      return ops::linear_cross_entropy(hidden.reshape({-1, hidden.size(-1)}), projection->weight, projection->bias, targets.reshape(-1));
    };
    // One line from the first rank that holds the head.
    const bool first_with_head = !job.topology || (job.topology->rank_in({Dim::Data, Dim::Tensor, Dim::Context}) == 0);
    if (first_with_head)
      std::cout << "fused_loss: " << name << " and the cross entropy computed by "
                << ops::select(ops::LinearCrossEntropy::name, job.model->parameters().front()).name() << "\n";
  }
};

void register_components(Registry& registry) { registry.add(std::make_unique<FusedLossPass>()); }

}  // namespace
}  // namespace strata::fused_loss

STRATA_PLUGIN("fused_loss", "0.1.0", strata::fused_loss::register_components)
