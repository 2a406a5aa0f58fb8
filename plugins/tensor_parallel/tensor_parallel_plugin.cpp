// Tensor parallel (Megatron style) over the tensor dimension of the mesh. The model is already
// built at its local shapes (ModelFactory::create_shard: attention by heads, MLP by its hidden
// width, token embedding and output head by vocabulary rows); this pass connects the pieces with
// the conjugate collectives at the layers' interception points and replaces the loss:
//   Column Linear     input through copy_to_group (identity forward, all-reduce backward)
//   Row Linear        output through reduce_from_group (all-reduce forward); bias added after
//   Replicated Linear output through copy_to_group (whole layer whose output each rank uses in
//                     part, e.g. Llama's k/v when the kv heads do not divide: its gradient sums)
//   Column Embedding  output through reduce_from_group (each rank contributes its rows)
//   TiedLinear head   input through copy_to_group; logits stay split by vocabulary
//   loss              vocab-parallel cross entropy (dist.h): full logits never exist
// Every other parameter (norms, positions, Row biases) sees identical gradients on every tensor
// rank, so nothing else is synchronised over the tensor group. Dropout: every dropout of the
// bundled models sits in a replicated region (after a Row layer's reduction, on the embedding
// sum), where all tensor ranks draw the same masks from the same generator state, which are also
// the single-process masks; no model here draws random numbers inside a split region.
#include <ATen/ATen.h>

#include "strata/dist.h"
#include "strata/plugin.h"

namespace strata::tensor_parallel {
namespace {

class TensorParallelPass final : public Pass {
 public:
  TensorParallelPass()
      : Pass({ComponentKind::Pass, "tensor_parallel",
              "Megatron tensor parallel over [parallel] tensor: column/row-parallel layers, vocab-parallel embedding and loss",
              Schema()},
             {Phase::ModelRewrite, {}, {}, {}, {}}, {{Dim::Tensor}, {}}) {}

  void apply(Job& job, const Config&) const override {
    Communicator& group = job.topology->group(Dim::Tensor);
    if (group.size() == 1) return;  // nothing is split
    int split_layers = 0;
    for (const auto& item : job.model->named_modules()) {
      torch::nn::Module* module = item.value().get();
      if (auto* linear = dynamic_cast<nn::Linear*>(module)) {
        switch (linear->parallel_style) {
          case nn::ParallelStyle::Column:
            linear->hooks.on_input = [&group](const at::Tensor& x) { return dist::copy_to_group(x, group); };
            ++split_layers;
            break;
          case nn::ParallelStyle::Row:
            linear->hooks.on_output = [&group](const at::Tensor& y) { return dist::reduce_from_group(y, group); };
            ++split_layers;
            break;
          case nn::ParallelStyle::Replicated:
            linear->hooks.on_output = [&group](const at::Tensor& y) { return dist::copy_to_group(y, group); };
            break;
          default:  // whole, in a replicated region: every rank computes the same
            break;
        }
      } else if (auto* embedding = dynamic_cast<nn::Embedding*>(module); embedding && embedding->shard.parts > 1) {
        embedding->hooks.on_output = [&group](const at::Tensor& y) { return dist::reduce_from_group(y, group); };
      } else if (auto* head = dynamic_cast<nn::TiedLinear*>(module); head && head->embedding().shard.parts > 1) {
        head->hooks.on_input = [&group](const at::Tensor& x) { return dist::copy_to_group(x, group); };
      }
    }
    if (split_layers == 0)
      throw UserError("tensor_parallel: model '" + job.job_config().get_string("model") + "' has no layer split over the tensor ranks");
    // The logits are this rank's vocabulary columns: [vocab_start, vocab_start + local).
    const int64_t rank = group.rank();
    job.loss = [&group, rank](const at::Tensor& logits, const at::Tensor& targets) {
      const int64_t local = logits.size(-1);
      return dist::vocab_parallel_cross_entropy(logits.reshape({-1, local}), targets.reshape(-1), rank * local, group);
    };
  }
};

void register_components(Registry& registry) { registry.add(std::make_unique<TensorParallelPass>()); }

}  // namespace
}  // namespace strata::tensor_parallel

STRATA_PLUGIN("tensor_parallel", "0.1.0", strata::tensor_parallel::register_components)
