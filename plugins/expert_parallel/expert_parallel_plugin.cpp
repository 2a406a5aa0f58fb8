// Expert parallel (as Megatron's expert-data-parallel and torchtitan place it): the experts of
// every mixture-of-experts layer split over an `expert` mesh group carved out of the data ranks.
//
//   [parallel] expert = P   a factor of data, not of the world size: data rank c belongs to
//                           expert group c / P at coordinate c % P; every rank still reads its
//                           own slice of the batch
//   experts                 rank p of a group keeps experts [p E/P, (p+1) E/P) of each layer
//                           (nn::GroupedLinear::keep_groups: placement sharded over Dim::Expert,
//                           so checkpoints record it and load under any expert size); core builds
//                           the model keeping them as each layer is drawn (ExpertSplitAtBuild), so
//                           no rank holds every expert, and split_experts finds them kept
//   dispatch / combine      routing stays on the token's rank; per-expert row counts go out by an
//                           all-to-all, then the rows (variable splits) to the ranks holding their
//                           experts, and back after the experts ran (nn::all_to_all_rows, whose
//                           backward is the reverse exchange); the layer holds the details
//                           (plugins/models/moe_layer.h)
//   gradients               an expert's gradient sums every source rank's tokens; the layer scales
//                           it by 1/P, and ddp averages it over the expert-data group (the data
//                           ranks holding the same experts) instead of the data group: together
//                           the single-process mean. Router, attention, norms and embeddings
//                           are replicated over all data ranks and averaged as before.
//   bytes                   per MoE layer and micro-batch of T tokens routed to k experts of width
//                           d, a rank sends T k d b (P-1)/P bytes to dispatch and as much to
//                           combine, the same again in backward (uniform routing)
// Composes with ddp, zero1/zero2 or fsdp (one of them required when data > 1: they broadcast,
// reduce and shard the experts over the expert-data group) and with pipeline parallel.
#include <algorithm>
#include <cstdio>

#include "../sharding/expert_split.h"
#include "strata/job.h"
#include "strata/plugin.h"

namespace strata::expert_parallel {
namespace {

// Bytes one rank sends to dispatch its tokens' rows in one MoE layer and micro-batch (as many again
// to combine, and both again in backward), under uniform routing: T tokens, each to top_k experts,
// rows of d_model elements, (P-1)/P of them to other ranks.
double dispatch_bytes(double tokens, const Config& model, int64_t expert_ranks, double element_bytes) {
  const double p = static_cast<double>(expert_ranks);
  return tokens * static_cast<double>(model.get_int("top_k") * model.get_int("d_model")) * element_bytes * (p - 1) / p;
}

class ExpertParallelPass final : public Pass {
 public:
  ExpertParallelPass()
      : Pass({ComponentKind::Pass, "expert_parallel",
              "Experts of mixture-of-experts layers split over [parallel] expert ranks (a factor of data); tokens dispatched and "
              "combined by all-to-all",
              Schema()},
             {Phase::ModelRewrite, {}, {}, {}, {}}, {{Dim::Expert}, {}}) {}

  std::string size_problem(const Config&, const Config& model, const MeshSizes& mesh) const override {
    if (!model.has("n_experts")) return "pass 'expert_parallel': the model has no experts ([model] n_experts); use model = \"mixtral\"";
    const int64_t experts = model.get_int("n_experts");
    if (experts % mesh.expert != 0)
      return "[model] n_experts " + std::to_string(experts) + " does not divide by [parallel] expert = " + std::to_string(mesh.expert);
    return {};
  }

  std::string describe_plan(const Config&, const PlanFacts& facts) const override {
    const int64_t p = facts.mesh.expert, experts = facts.model.get_int("n_experts");
    const double tokens = static_cast<double>(facts.job.get_int("global_batch") / std::max<int64_t>(1, facts.mesh.data) / facts.mesh.micro_batches * facts.model.get_int("seq_len"));
    const double bytes = dispatch_bytes(tokens, facts.model, p, 4.0);
    char line[200];
    std::snprintf(line, sizeof line, "%.0f", bytes);
    return "experts: " + std::to_string(experts / p) + " of " + std::to_string(experts) + " per rank in each MoE layer (expert groups of " +
           std::to_string(p) + " data ranks), kept as the model is built\nall-to-all per MoE layer and micro-batch, uniform routing, fp32: " + line +
           " bytes sent per rank to dispatch, as many to combine, and the same again in backward\n";
  }

  // Each rank keeps 1/P of the routed experts' parameters and their states: weights, gradients
  // and optimizer state shrink to ExpertSplit::kept() of what they were (passes estimated before,
  // pipeline and tensor, divided the experts as they divided the rest). The data-parallel passes,
  // estimated after this one, then shard and reduce the split experts' fraction over the
  // expert-data group (sharding/expert_split.h). Each MoE layer a rank runs sends, per
  // micro-batch, dispatch_bytes to dispatch, as many to combine, and both again in backward.
  void estimate(const Config&, const PlanFacts& facts, CostEstimate& c) const override {
    const sharding::ExpertSplit split = sharding::expert_split(facts, c);
    if (split.ranks <= 1) return;
    c.weight_bytes *= split.kept(), c.gradient_bytes *= split.kept(), c.optimizer_bytes *= split.kept();
    const double moe_layers = static_cast<double>(facts.model.get_int("n_layer") / std::max<int64_t>(1, facts.model.get_int("moe_every")));
    const double moe_layers_per_rank = c.layers_per_rank * moe_layers / static_cast<double>(std::max<int64_t>(1, c.model.layers));
    const double tokens = static_cast<double>(c.micro_batch) * c.seq_per_rank;
    c.comm_bytes += static_cast<double>(c.micro_batches) * moe_layers_per_rank * 4 *
                    dispatch_bytes(tokens, facts.model, facts.mesh.expert, c.activation_element_bytes);
    // Per MoE layer and micro-batch: the row counts, dispatch and combine, and both again in backward.
    c.messages += static_cast<double>(c.micro_batches) * moe_layers_per_rank * 5;
  }

  void apply(Job& job, const Config&) const override {
    Communicator& group = job.topology->group(Dim::Expert);
    int64_t layers = 0;
    for (const auto& module : job.model->modules(/*include_self=*/false))
      if (auto* layer = dynamic_cast<nn::ExpertParallelLayer*>(module.get())) {
        layer->split_experts(group);
        ++layers;
      }
    if (!found_on_any_rank(job, layers > 0))
      throw UserError("pass 'expert_parallel': the model has no mixture-of-experts layer to split");
  }
};

void register_components(Registry& registry) { registry.add(std::make_unique<ExpertParallelPass>()); }

}  // namespace
}  // namespace strata::expert_parallel

STRATA_PLUGIN("expert_parallel", "0.1.0", strata::expert_parallel::register_components)
