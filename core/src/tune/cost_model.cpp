// Core's part of the cost model (strata/cost.h): one process training the data-parallel rank's
// share of the global batch on the whole model, in fp32. The passes rescale it.
#include <algorithm>
#include <cmath>

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

// Elements one transformer layer saves for its backward per token, counted from the autograd
// graph of Strata's blocks in fp32. Attention is fused (flash-style: attention.fused_cpu on a CPU,
// ATen's flash or cuDNN kernels on a GPU), so it keeps q, k, v, its output and the log-sum-exp,
// never the [s, s] scores that Korthikanti et al.'s 5as/h term counts; dropout's masks (dropout is
// off by default) are not counted.
// Per token: the two norms' inputs and outputs (4h, what tensor parallel leaves whole without
// sequence parallel), q, k and v (h + 2h kv/heads), the attention's output (h), and the MLP's
// inner values: GELU's input and output (2 ffn) or SwiGLU's gate, up and product (3 ffn). A
// mixture-of-experts layer runs each token through [model] top_k routed experts and its shared
// ones, each keeping its SwiGLU's 3 ffn and the token's gathered input, output and weighted
// output (3h). Which MLP a layer has is read from its parameters (2 h ffn, 3 h ffn, or more).
// Measured with the counting CPU allocator (the difference between 2 and 6 layers, one process,
// seq 256 x 8 sequences, d_model 256, less the model states): GPT 16.05h, Llama (ffn 3h, 2 kv
// heads of 4) 16.05h, Llama with ffn 4h 19.05h, Mixtral (4 experts, top_k 2, ffn 3h) 31.1h,
// where this counts 16h, 16h, 19h and 31h. GPT at seq 1024 x 2 kept the same bytes as at
// 256 x 8: no [s, s] term.
// A transformer layer's MLP as its parameters show it: GELU (2 h ffn), SwiGLU (3 h ffn), or, with
// [model] top_k, a mixture of experts of SwiGLU experts, of which a token runs through top_k routed
// and the shared ones. Models may route in only some layers: routed_share is the share that do.
struct LayerMlp {
  bool gelu = false;
  double swiglus = 1;       // SwiGLU MLPs in a layer that does not route
  double routed_share = 0;  // of the layers
  double experts = 0, top_k = 0, shared = 0;  // a routing layer's routed experts, those a token runs through, shared ones
};

LayerMlp layer_mlp(const ModelShape& m, const Config& model_config) {
  const double h = static_cast<double>(m.hidden), heads = static_cast<double>(std::max<int64_t>(1, m.heads));
  const double kv = m.kv_heads > 0 ? static_cast<double>(m.kv_heads) : heads, ffn = m.ffn_hidden > 0 ? static_cast<double>(m.ffn_hidden) : 4 * h;
  const double attention_parameters = 2 * h * h + 2 * h * h * kv / heads + 2 * h;
  const double mlp_widths = std::max(0.0, static_cast<double>(m.layer_parameters) - attention_parameters) / (h * ffn);
  LayerMlp mlp;
  if (mlp_widths < 2.5) {
    mlp.gelu = true;
  } else if (mlp_widths < 3.5 || !model_config.has("top_k")) {
    mlp.swiglus = std::max(1.0, std::round(mlp_widths / 3));
  } else {
    // The mean layer's experts against a routing layer's: the share of layers that route.
    mlp.shared = model_config.has("shared_experts") ? static_cast<double>(model_config.get_int("shared_experts")) : 0;
    mlp.experts = model_config.has("n_experts") ? static_cast<double>(model_config.get_int("n_experts")) : mlp_widths / 3;
    const double all = mlp.experts + mlp.shared;
    mlp.routed_share = all > 1 ? std::clamp((mlp_widths / 3 - 1) / (all - 1), 0.0, 1.0) : 1.0;
    mlp.top_k = static_cast<double>(model_config.get_int("top_k"));
  }
  return mlp;
}

double layer_saved_values_per_token(const ModelShape& m, const Config& model_config) {
  const double h = static_cast<double>(m.hidden), heads = static_cast<double>(std::max<int64_t>(1, m.heads));
  const double kv = m.kv_heads > 0 ? static_cast<double>(m.kv_heads) : heads, ffn = m.ffn_hidden > 0 ? static_cast<double>(m.ffn_hidden) : 4 * h;
  const double attention = 4 * h + h * (1 + 2 * kv / heads) + h;
  const LayerMlp mlp = layer_mlp(m, model_config);
  if (mlp.gelu) return attention + 2 * ffn;
  return attention + mlp.routed_share * (mlp.top_k + mlp.shared) * (3 * ffn + 3 * h) + (1 - mlp.routed_share) * 3 * ffn * mlp.swiglus;
}

// The parameters a token computes with: all but a mixture of experts' unchosen routed experts
// (each 3 h ffn), as the model's own training_flops_per_token counts for MFU.
double active_parameters(const ModelShape& m, const Config& model_config) {
  const LayerMlp mlp = layer_mlp(m, model_config);
  const double ffn = m.ffn_hidden > 0 ? static_cast<double>(m.ffn_hidden) : 4 * static_cast<double>(m.hidden);
  const double unchosen = std::max(0.0, mlp.experts - mlp.top_k);
  return static_cast<double>(m.parameters) - static_cast<double>(m.layers) * mlp.routed_share * unchosen * 3 * static_cast<double>(m.hidden) * ffn;
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
    const double s = static_cast<double>(m.seq_len), b = static_cast<double>(c.micro_batch), h = static_cast<double>(m.hidden);
    c.activation_bytes = 4 * static_cast<double>(m.layers) * s * b * layer_saved_values_per_token(m, plan.model);
    // The logits and their gradient in fp32, alive together at the loss.
    c.transient_bytes = 2 * 4 * s * b * static_cast<double>(m.vocab);
    // 6 FLOPs per parameter a token computes with (forward 2, backward 4) plus the attention's scores and
    // weighted sums, 12 L h s per token over forward and backward.
    const double tokens = b * static_cast<double>(c.micro_batches) * s;
    c.flops = 6 * active_parameters(m, plan.model) * tokens + 12 * static_cast<double>(m.layers) * h * s * tokens;
  }
  return c;
}

CostEstimate add_pass_estimates(const ResolvedStrategy& plan, const std::vector<size_t>& order, CostEstimate c) {
  const PlanFacts facts = plan_facts(plan);
  for (size_t i : order) {
    const PassEntry& p = plan.passes[i];
    if (p.enabled) p.pass->estimate(p.config, facts, c);
  }
  // Gradients are set to none as each step starts (engine/trainer.cpp) and the data-parallel
  // passes let their gradient buffers go before its first forward (sharding's
  // FlatUnit::release_gradients), so gradients are alive at the end of the forward only where
  // earlier micro-batches of the step accumulated them. Otherwise backward creates each layer's
  // gradients as it frees the layer's saved tensors, and the peak holds the larger of the
  // forward's end and the gradients: counted as a transient beyond the activations (GPT d256 at
  // seq 256 x 8: 43.10 MB a layer with ddp and without; before ddp let its buckets go between
  // steps, one layer's 3.16 MB of gradients more with it).
  if (c.micro_batches == 1) {
    const double activations = c.activation_bytes * c.in_flight;
    c.transient_bytes = std::max(activations + c.transient_bytes, c.gradient_bytes) - activations;
    c.gradient_bytes = 0;
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
