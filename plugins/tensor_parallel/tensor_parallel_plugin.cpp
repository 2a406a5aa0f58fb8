// Tensor parallel (Megatron style) over the tensor dimension of the mesh, with optional sequence
// parallel. The model is already built at its local shapes (ModelFactory::create_shard:
// attention by heads, MLP by its hidden width, token embedding and output head by vocabulary
// rows); this pass connects the pieces with the conjugate collectives at the layers'
// interception points (nn::LayerHooks) and replaces the loss.
//
// Without sequence parallel the residual stream (norms, dropout, residual adds, positions) is
// replicated over the tensor group:
//   Column Linear     input through copy_to_group (identity forward, all-reduce backward)
//   Row Linear        output through reduce_from_group (all-reduce forward); bias added after
//   Replicated Linear output through copy_to_group (whole layer whose output each rank uses in
//                     part, e.g. Llama's k/v when the kv heads do not divide: its gradient sums)
//   Column Embedding  output through reduce_from_group (each rank contributes its rows)
//   TiedLinear head   input through copy_to_group; logits stay split by vocabulary
//   GroupedLinear     experts of an MoE layer, split like Column / Row Linears (their rows in
//                     through copy_to_group, out through reduce_from_group), with or without
//                     sequence parallel
// With sequence parallel the residual stream is split by tokens (dimension -2, s/t per rank):
//   Sequence norm     output through gather_along (all-gather forward, reduce-scatter backward):
//                     the whole sequence for the Column layers it feeds, which then need no
//                     hook (the reduce-scatter sums their input gradients)
//   Row Linear        output through reduce_scatter_along (reduce-scatter forward, all-gather
//                     backward): this rank's tokens, summed
//   Column Embedding  output through reduce_scatter_along
//   Sequence Embedding (learned positions) output through scatter_along: this rank's positions
//   Dropout           this rank's rows of the whole sequence's mask (nn::Dropout)
//   MoE layer         computes on the gathered sequence, alike on every rank, and cuts its output
//                     to this rank's tokens (nn::SequenceParallelLayer, handed the tensor group);
//                     one that sums its Row experts itself (nn::SumsRowSplitOutputs) gets their
//                     outputs partial and reduce-scatters them
// and every whole parameter that now sees only this rank's tokens (norm weights and biases, Row
// biases, a Replicated Linear's weight) computes through copy_to_group, so its gradient is the sum
// over the tensor group before any data-parallel pass sees it.
//   loss              vocab-parallel cross entropy (dist.h) on the whole sequence's logits
//                     split by vocabulary: full logits never exist
// Dropout rule: every dropout of the bundled models sits on the residual stream, where all tensor
// ranks draw the same masks from the same generator state, which are also the single-process
// masks (under sequence parallel each rank applies its tokens' rows of that mask); no bundled
// model draws random numbers inside a split region, where masks would have to differ per rank.
#include <algorithm>

#include <ATen/ATen.h>

#include "strata/dist.h"
#include "strata/job.h"
#include "strata/plugin.h"

namespace strata::tensor_parallel {
namespace {

// Activations are [.., tokens, features]: sequence parallel splits the tokens.
constexpr int64_t kTokenDim = -2;

class TensorParallelPass final : public Pass {
 public:
  TensorParallelPass()
      : Pass({ComponentKind::Pass, "tensor_parallel",
              "Megatron tensor parallel over [parallel] tensor: column/row-parallel layers, vocab-parallel embedding and loss, "
              "optional sequence parallel",
              Schema().boolean("sequence_parallel", false,
                               "Split the residual stream (norms, dropout, residual adds) by tokens over the tensor ranks: "
                               "all-gather before column layers, reduce-scatter after row layers; needs [model] seq_len divisible "
                               "by [parallel] tensor")
                  .tuned({false, true})},
             {Phase::ModelRewrite, {}, {}, {}, {}}, {{Dim::Tensor}, {}}) {}

  std::string size_problem(const Config& config, const Config& model, const MeshSizes& mesh) const override {
    // Under context parallel each rank's share of the tokens (seq_len / context) is what splits.
    if (!config.get_bool("sequence_parallel") || !model.has("seq_len") || model.get_int("seq_len") % (mesh.tensor * mesh.context) == 0)
      return {};
    return "pass 'tensor_parallel': sequence_parallel needs [model] seq_len " + std::to_string(model.get_int("seq_len")) +
           " to divide by [parallel] tensor = " + std::to_string(mesh.tensor) +
           (mesh.context > 1 ? " x context = " + std::to_string(mesh.context) : std::string());
  }

  // Each rank holds 1/t of the layers and the vocabulary and does 1/t of their FLOPs; activations
  // shrink by t with sequence parallel, but for the two norms' outputs, which the column layers
  // keep as all-gathered (2h per token whole: t = 2, GPT d256, 8 x 256 tokens: 2.14 MB a layer
  // more than 1/t, where this counts 2.10), and without it all but the two norms' inputs and
  // outputs (4h per token, whole on every rank: core's count in tune/cost_model.cpp). This pass estimates
  // before context parallel and precision rescale (ModelRewrite, ordered before context_parallel),
  // so the activations are still fp32 over the whole sequence. Per layer and micro-batch, forward
  // and backward move four [s, b, h] all-reduces (or all-gather/reduce-scatter pairs with sequence
  // parallel: the same bytes).
  void estimate(const Config& config, const PlanFacts&, CostEstimate& c) const override {
    const double t = static_cast<double>(c.tensor), h = static_cast<double>(c.model.hidden);
    c.weight_bytes /= t, c.gradient_bytes /= t, c.optimizer_bytes /= t, c.flops /= t, c.transient_bytes /= t;
    if (h <= 0) return;
    const double s = c.seq_per_rank;
    const double whole = std::min(c.activation_bytes, 4 * 4 * h * static_cast<double>(c.model.seq_len) * static_cast<double>(c.micro_batch) * c.layers_per_rank);
    const double gathered = whole / 2;  // the norms' outputs, the column layers' gathered inputs
    c.activation_bytes = config.get_bool("sequence_parallel") ? c.activation_bytes / t + gathered * (1 - 1 / t)
                                                               : whole + (c.activation_bytes - whole) / t;
    c.comm_bytes += c.layers_per_rank * static_cast<double>(c.micro_batches) * 4 * 2 * (t - 1) / t * s *
                    static_cast<double>(c.micro_batch) * h * c.activation_element_bytes;
    // Per layer: 2 all-reduces forward, 2 backward (sequence parallel: an all-gather and a
    // reduce-scatter for each); per micro-batch a few more for the vocabulary-parallel loss.
    c.messages += static_cast<double>(c.micro_batches) * (c.layers_per_rank * (config.get_bool("sequence_parallel") ? 8 : 4) + 4);
  }

  void apply(Job& job, const Config& config) const override {
    Communicator& group = job.topology->group(Dim::Tensor);
    if (group.size() == 1) return;  // nothing is split
    const bool sp = config.get_bool("sequence_parallel");
    const nn::TensorShard shard{group.size(), group.rank()};
    using Hook = std::function<at::Tensor(const at::Tensor&)>;
    const Hook copy = [&group](const at::Tensor& x) { return dist::copy_to_group(x, group); };
    const Hook reduce = [&group](const at::Tensor& y) { return dist::reduce_from_group(y, group); };
    const Hook gather = [&group](const at::Tensor& x) { return dist::gather_along(x, kTokenDim, group); };
    const Hook reduce_scatter = [&group](const at::Tensor& y) { return dist::reduce_scatter_along(y, kTokenDim, group); };
    const Hook scatter = [&group](const at::Tensor& y) { return dist::scatter_along(y, kTokenDim, group); };
    int split_layers = 0, sequence_layers = 0, split_experts = 0;
    // Layers that sum their Row experts' outputs themselves (nn::SumsRowSplitOutputs), by name
    // prefix: modules come parents first.
    std::vector<std::string> summing_layers;
    const auto summed_by_layer = [&summing_layers](const std::string& name) {
      return std::any_of(summing_layers.begin(), summing_layers.end(), [&](const std::string& p) { return name.rfind(p, 0) == 0; });
    };
    for (const auto& item : job.model->named_modules()) {
      torch::nn::Module* module = item.value().get();
      if (auto* layer = dynamic_cast<nn::SequenceParallelLayer*>(module); layer && sp) {
        layer->split_tokens(group), ++sequence_layers;
        if (dynamic_cast<nn::SumsRowSplitOutputs*>(module)) summing_layers.push_back(item.key() + ".");
      }
      if (auto* linear = dynamic_cast<nn::Linear*>(module)) {
        switch (linear->parallel_style) {
          case nn::ParallelStyle::Column:
            if (!sp) linear->hooks.on_input = copy;  // under sp the norm's gather feeds it
            ++split_layers;
            break;
          case nn::ParallelStyle::Row:
            if (sp) {
              linear->hooks.on_output = reduce_scatter;
              linear->hooks.on_bias = copy;  // added to this rank's tokens only
            } else {
              linear->hooks.on_output = reduce;
            }
            ++split_layers;
            break;
          case nn::ParallelStyle::Replicated:
            if (sp) {
              linear->hooks.on_weight = copy;  // input gradient partial (summed by the gather), weight gradient summed here
              linear->hooks.on_bias = copy;
            } else {
              linear->hooks.on_output = copy;
            }
            break;
          default:  // whole, in a replicated region: every rank computes the same
            break;
        }
      } else if (auto* experts = dynamic_cast<nn::GroupedLinear*>(module); experts && experts->shard.parts > 1) {
        // Mixture-of-experts experts: alike with sequence parallel, whose MoE layer gathers and
        // cuts, or reduce-scatters their Row outputs itself.
        if (experts->parallel_style == nn::ParallelStyle::Column) experts->hooks.on_input = copy;
        else if (!(sp && summed_by_layer(item.key()))) experts->hooks.on_output = reduce;
        ++split_layers, ++split_experts;
      } else if (auto* embedding = dynamic_cast<nn::Embedding*>(module)) {
        if (embedding->shard.parts > 1) embedding->hooks.on_output = sp ? reduce_scatter : reduce;
        else if (sp && embedding->parallel_style == nn::ParallelStyle::Sequence) embedding->hooks.on_output = scatter;
      } else if (auto* head = dynamic_cast<nn::TiedLinear*>(module); head && head->embedding().shard.parts > 1) {
        if (!sp) head->hooks.on_input = copy;
      } else if (auto* norm = dynamic_cast<nn::LayerNorm*>(module); norm && sp) {
        require_sequence_style(norm->parallel_style, item.key());
        norm->hooks.on_weight = norm->hooks.on_bias = copy;
        norm->hooks.on_output = gather;
      } else if (auto* rms = dynamic_cast<nn::RmsNorm*>(module); rms && sp) {
        require_sequence_style(rms->parallel_style, item.key());
        rms->hooks.on_weight = copy;
        rms->hooks.on_output = gather;
      } else if (auto* dropout = dynamic_cast<nn::Dropout*>(module); dropout && sp) {
        dropout->sequence_shard = shard;
      }
    }
    if (sp && split_experts > 0 && sequence_layers == 0)
      throw UserError("tensor_parallel: sequence_parallel needs the layer holding the split experts to take the tensor group "
                      "(nn::SequenceParallelLayer); model '" + job.job_config().get_string("model") + "' has none");
    if (!found_on_any_rank(job, split_layers > 0))
      throw UserError("tensor_parallel: model '" + job.job_config().get_string("model") + "' has no layer split over the tensor ranks");
    // The logits are this rank's vocabulary columns (nn::shard_range of the vocabulary), or all of
    // them when the model's output layer is not split (a program's own model may keep it whole).
    const int64_t vocab = job.model->vocab_size(), vocab_start = nn::shard_range(vocab, shard).start;
    job.loss = [&group, vocab, vocab_start](const at::Tensor& logits, const at::Tensor& targets) {
      const int64_t local = logits.size(-1);
      if (local == vocab) return ops::cross_entropy(logits.reshape({-1, vocab}), targets.reshape(-1));
      return dist::vocab_parallel_cross_entropy(logits.reshape({-1, local}), targets.reshape(-1), vocab_start, group);
    };
    // Bytes this rank's model-parallel collectives moved in the step, forward and backward.
    auto last = std::make_shared<dist::Traffic>(dist::traffic());
    job.add_hook(HookPoint::AfterStep, [last](StepContext& context) {
      const dist::Traffic now = dist::traffic();
      context.metrics.emplace_back("tp_all_reduce_bytes", static_cast<double>(now.all_reduce - last->all_reduce));
      context.metrics.emplace_back("tp_all_gather_bytes", static_cast<double>(now.all_gather - last->all_gather));
      context.metrics.emplace_back("tp_reduce_scatter_bytes", static_cast<double>(now.reduce_scatter - last->reduce_scatter));
      *last = now;
    });
  }

 private:
  // Sequence parallel gathers every norm's output for the Column layers after it: a norm of
  // another kind (inside a split region, say) would need its own rule, so it is refused.
  static void require_sequence_style(nn::ParallelStyle style, const std::string& name) {
    if (style != nn::ParallelStyle::Sequence)
      throw UserError("tensor_parallel: sequence_parallel does not know where norm '" + name +
                      "' sits (it is not marked as a residual-stream norm, nn::ParallelStyle::Sequence)");
  }
};

void register_components(Registry& registry) { registry.add(std::make_unique<TensorParallelPass>()); }

}  // namespace
}  // namespace strata::tensor_parallel

STRATA_PLUGIN("tensor_parallel", "0.2.0", strata::tensor_parallel::register_components)
