// Core's part of the cost model (strata/cost.h): one process training the data-parallel rank's
// share of the global batch on the whole model, in fp32. The passes rescale it.
#include <algorithm>

#include <ATen/ATen.h>

#include "strata/core/tune.h"
#include "strata/model.h"
#include "strata/optimizer.h"
#include "strata/pass.h"

namespace strata {
namespace {

// Bytes of optimizer state per parameter element, found by building the chosen optimizer on a probe
// parameter and weighing the state it holds from construction on (Optimizer::state_tensors): AdamW
// 8, SGD with momentum 4, plain SGD 0, and a plugin's optimizer whatever it keeps.
double optimizer_bytes_per_element(const ResolvedStrategy& plan) {
  const auto* factory = dynamic_cast<const OptimizerFactory*>(plan.optimizer_component);
  if (!factory) return 8;  // AdamW's two moments, core's default
  constexpr int64_t kProbe = 4096;
  at::Tensor probe = at::zeros({kProbe}).requires_grad_(true);
  ParamGroup group{{"probe"}, {probe}, 0.0};
  double bytes = 0;
  for (const auto& [name, tensor] : factory->create({group}, plan.optimizer)->state_tensors())
    if (tensor.defined()) bytes += static_cast<double>(tensor.numel() * tensor.element_size());
  return bytes / kProbe;
}

}  // namespace

CostEstimate core_estimate(const ResolvedStrategy& plan) {
  const PlanFacts facts = plan_facts(plan);
  CostEstimate c;
  c.model = facts.model_factory.shape(plan.model);
  c.data = facts.mesh.data, c.tensor = facts.mesh.tensor, c.pipeline = facts.mesh.pipeline, c.context = facts.mesh.context;
  c.micro_batches = facts.mesh.micro_batches;
  c.micro_batch = std::max<int64_t>(1, plan.job.get_int("global_batch") / c.data / c.micro_batches);

  const ModelShape& m = c.model;
  c.layers_per_rank = static_cast<double>(m.layers) / static_cast<double>(c.pipeline);
  c.seq_per_rank = static_cast<double>(m.seq_len) / static_cast<double>(c.context);
  const double params = static_cast<double>(m.parameters);
  // Model states in fp32: weights, gradients, the optimizer's state.
  c.weight_bytes = 4 * params, c.gradient_bytes = 4 * params, c.optimizer_bytes = optimizer_bytes_per_element(plan) * params;

  if (m.layers > 0 && m.hidden > 0) {
    const double s = static_cast<double>(m.seq_len), b = static_cast<double>(c.micro_batch), h = static_cast<double>(m.hidden),
                 a = static_cast<double>(m.heads);
    // Korthikanti et al. 2022, bytes of one layer's saved activations at 16 bits: sbh(34 + 5as/h);
    // fp32 doubles them. The 5as/h term is the attention's [s, s] scores, softmax and dropout.
    c.activation_bytes = 2 * static_cast<double>(m.layers) * s * b * h * (34 + 5 * a * s / h);
    // The logits and their gradient in fp32, alive together at the loss.
    c.transient_bytes = 2 * 4 * s * b * static_cast<double>(m.vocab);
    // 6 FLOPs per parameter and token (forward 2, backward 4) plus the attention's scores and
    // weighted sums, 12 L h s per token over forward and backward.
    const double tokens = b * static_cast<double>(c.micro_batches) * s;
    c.flops = 6 * params * tokens + 12 * static_cast<double>(m.layers) * h * s * tokens;
  }
  return c;
}

CostEstimate add_pass_estimates(const ResolvedStrategy& plan, const std::vector<size_t>& order, CostEstimate c) {
  const PlanFacts facts = plan_facts(plan);
  for (size_t i : order) {
    const PassEntry& p = plan.passes[i];
    if (p.enabled) p.pass->estimate(p.config, facts, c);
  }
  return c;
}

double predicted_step_seconds(const CostEstimate& cost, const HardwareRates& rates) {
  const double stretch = std::max(1 / std::max(1e-3, 1 - cost.bubble), rates.oversubscription);
  const double compute = cost.flops / rates.flops_per_s * stretch;
  const double overhead = cost.layers_per_rank * static_cast<double>(cost.micro_batches) * rates.layer_overhead_s * rates.oversubscription;
  // Tensor and pipeline parallel split the parameters a rank streams through its GEMMs; data and
  // context parallel do not (fsdp gathers them back), nor does splitting the tokens.
  const double computed_parameters =
      static_cast<double>(cost.model.parameters) / static_cast<double>(std::max<int64_t>(1, cost.tensor * cost.pipeline));
  const double parameter_pass = computed_parameters * static_cast<double>(cost.micro_batches) * rates.parameter_pass_s * rates.oversubscription;
  return compute + overhead + parameter_pass + cost.comm_bytes / rates.bytes_per_s + cost.messages * rates.message_latency_s;
}

double predicted_peak_bytes(const CostEstimate& cost, const HardwareRates& rates) { return cost.peak_bytes() + rates.process_bytes; }

}  // namespace strata
