// A mixture-of-experts MLP (Mixtral's sparse block, with DeepSeekMoE's shared experts and GShard's
// capacity as options), the layer behind [job] model = "mixtral".
//
// Routing, per micro-batch of this rank's N tokens: logits = x W_g^T in fp32, probs = softmax,
// the top_k experts of each token by probability, their weights renormalised to sum to 1.
// Assignments are taken choice-major (every token's first choice, in token order, then every
// second choice): with capacity_factor c > 0 an expert keeps its first C = ceil(c k N / E) and the
// rest are dropped (the token's output from that expert is 0; the residual carries it);
// capacity_factor 0 is dropless. The kept assignments are sorted by expert (stably, so each
// expert's rows stay in that order) and every projection is one ops::grouped_mm over the
// variable-size groups: no gather per expert, no padding. Outputs come back to their tokens by
// index_add, weighted. The group sizes are read to the host (one counted read per forward).
// With a capacity, expert_rows = "padded" (GShard's layout) gives every expert exactly C rows
// instead, each kept assignment at its place in its expert's queue (the same order) and zeros in
// the empty slots: every shape is static, so nothing is read to the host and expert parallel's
// all-to-alls have equal splits, at the cost of computing and sending the empty slots (E C = c k N
// rows in all, against the kept ones).
//
// Auxiliary losses, per micro-batch and layer: Switch's load balancing
// L_aux = E sum_i f_i P_i (f_i: top-k selections of expert i, before capacity, over N; P_i: mean
// router probability of expert i; uniform routing gives k) and ST-MoE's z-loss
// L_z = mean_tokens logsumexp(logits)^2, each averaged over the model's MoE layers and added to
// the objective times router_aux_loss_coef / router_z_loss_coef through nn::add_auxiliary_loss
// (so pipeline stages and recomputation need nothing special). Under context parallel (c ranks,
// each holding N of the window's c N tokens) f counts the whole window (selections summed over
// the context group) and P stays this rank's mean: each rank's L_aux is then the part of the
// window's whose average over the context ranks (what their gradients get) is the window's
// L_aux, value and gradient. Capacity counts the whole window too: C = ceil(c k cN / E), each
// assignment's place in its expert's queue ranked over every context rank's assignments (their
// choice, sequence and window position gathered), so the same tokens are dropped as by one
// process. The z-loss is a mean over tokens and needs nothing. The reported loss stays the
// language-model loss; moe_aux_loss and moe_z_loss go to the metrics with the expert loads.
//
// balance = "bias" (DeepSeek-V3's auxiliary-loss-free balancing): a per-expert bias b (a buffer,
// checkpointed, not trained) is added to the probabilities for the top-k *selection* only; the
// chosen experts' weights are their unbiased probabilities, renormalised. After each optimizer
// step b_i += gamma sign(mean load - load_i), the loads being the step's top-k selections (before
// capacity) summed over every training forward and over the data x context ranks, so every rank
// and one process over the same batch move b alike, all on the device (no read). moe_max_load_ratio
// (busiest expert's load over the mean) goes to the metrics as a device figure.
#pragma once

#include <memory>
#include <vector>

#include "llama_layers.h"

namespace strata::models {

// [model] keys of the mixture of experts, added to a Llama schema.
Schema& add_moe_keys(Schema& schema);
void validate_moe(const Config& config, const SourcePos& section, Diagnostics& diagnostics);
// Whether block `layer` (0-based) of n_layer is an MoE block: every moe_every-th, the last of each group.
bool is_moe_layer(const Config& config, int64_t layer);
int64_t moe_layer_count(const Config& config);

// Hugging Face's MixtralForCausalLM keeps one tensor per expert and projection
// (model.layers.N.block_sparse_moe.experts.J.w1/w3/w2.weight: gate, up, down), Strata one
// [E, ., .] tensor per projection (its names mapped as model.layers.N.block_sparse_moe.experts.
// gate_proj/up_proj/down_proj.weight). These convert between the two, other tensors untouched;
// hub_expert_names gives the hub's per-expert names of a stacked name (empty for any other name).
std::vector<std::string> hub_expert_names(const std::string& stacked_name, int64_t experts);
NamedTensors hub_experts_from_stacked(const NamedTensors& tensors);
NamedTensors stacked_from_hub_experts(const NamedTensors& tensors, int64_t experts);
// MixtralForCausalLM computes what this model computes only with an MoE MLP in every block, no
// shared experts and no capacity: anything else is refused, naming the key.
void require_hub_mixtral(const Config& config);

struct MoeSettings {
  int64_t experts = 8, top_k = 2, shared_experts = 0;
  double capacity_factor = 0, aux_loss_coef = 0, z_loss_coef = 0;
  std::string expert_rows = "packed";  // with a capacity: "packed" or "padded"
  int64_t moe_layers = 1;  // in the model: each layer's losses weigh 1 / moe_layers
  bool bias_balance = false;  // balance = "bias"
  double bias_update_rate = 0.001;
  static MoeSettings from(const Config& config);
};

// The experts' SwiGLU projections, one [E, ., .] parameter each (transformers 5 keeps them so).
class GroupedExperts final : public torch::nn::Module {
 public:
  // Under tensor parallel (shard) each expert splits as Llama's MLP: gate and up by columns of
  // its hidden width, down by rows.
  GroupedExperts(int64_t experts, int64_t d_model, int64_t hidden, nn::TensorShard shard = {});
  // Rows sorted by expert, group_sizes per expert.
  at::Tensor forward(const at::Tensor& x, at::IntArrayRef group_sizes);
  std::shared_ptr<nn::GroupedLinear> gate_proj, up_proj, down_proj;
};

// Under tensor parallel the layer's input is whole on every tensor rank (under sequence parallel
// the norm before it gathers the sequence) and the router is whole and routes alike on every
// tensor rank; every expert is split as a Megatron MLP (gate/up by columns, down by rows), the
// rows entering the experts pass copy_to_group and the experts' outputs reduce_from_group (the
// tensor_parallel pass's hooks on the GroupedLinears), so the sum is whole before the routing
// weights multiply it and the router's gradient is the single-process one on every tensor rank.
// Shared experts split as Llama's MLP (under sequence parallel: their Column layers read the
// gathered sequence, their Row layer reduce-scatters to this rank's tokens).
// Under sequence parallel (split_tokens, nn::SequenceParallelLayer) the routed path's input
// gradient, alike on every tensor rank, is passed back for this rank's tokens only (the gather's
// reduce-scatter then sums each token's once). The layer sums its split experts' outputs itself
// (nn::SumsRowSplitOutputs): tensor_parallel leaves the Row experts' outputs partial, the routing
// weights multiply the partial rows, and the layer's output is reduce-scattered to this rank's
// tokens (an all-gather of the gradient backward), half the bytes of an all-reduce and a cut.
// Each routing weight's gradient is a dot product with its partial row, so it is summed over the
// tensor ranks (copy_to_group on the weights: one scalar per routed row), and the router's
// gradient stays the single-process one on every rank. Experts that are not split (a model's own
// whole experts under tensor parallel) are summed by no one: their whole output is cut.
//
// Under expert parallel (split_experts, the expert_parallel pass) rank r of the expert group of
// P ranks keeps experts [r E/P, (r+1) E/P). Routing stays on each token's own rank; the rows
// sorted by expert are contiguous per destination, so dispatch is one all-to-all (counts
// exchanged first, on the device, and read with the rank's own in its one read), the received
// rows are regrouped by local expert (from every source, in source order), computed, put back,
// and returned by a second all-to-all (combine) before the weighted sum. An expert's gradient sums over every rank's tokens; it is scaled by 1/P inside
// the layer so that averaging it over the ranks that hold the same experts (ddp over the
// expert-data group) gives the single-process gradient.
class MoeLayer final : public torch::nn::Module,
                       public nn::ReportsMetrics,
                       public nn::ReportsDeviceMetrics,
                       public nn::ExpertParallelLayer,
                       public nn::AdjustsAfterStep,
                       public nn::SequenceStatisticsLayer,
                       public nn::SequenceParallelLayer,
                       public nn::SumsRowSplitOutputs {
 public:
  MoeLayer(const MoeSettings& settings, int64_t d_model, int64_t hidden, nn::TensorShard shard = {});
  at::Tensor forward(const at::Tensor& x);
  void report_metrics(std::vector<std::pair<std::string, double>>& out) override;
  // moe_aux_loss and moe_z_loss, kept on the device: no read in the forward.
  void report_device_metrics(std::vector<std::pair<std::string, at::Tensor>>& out) override;
  int64_t experts() const override { return settings_.experts; }
  void split_experts(Communicator& group) override;
  // Sums the step's figures over `token_ranks` (the balance and z losses averaged); with
  // balance = "bias", moves expert_bias by the step's loads over them (see above).
  void after_optimizer_step(Communicator& token_ranks) override;
  // Context parallel: the balance loss's f (selections over tokens) counts the whole window.
  void split_sequence(Communicator& context_group) override { context_group_ = &context_group; }
  // Sequence parallel: see above.
  void split_tokens(Communicator& tensor_group) override { tensor_group_ = &tensor_group; }

  std::shared_ptr<nn::Linear> gate;  // the router, d -> E
  std::shared_ptr<GroupedExperts> routed_experts;  // registered as "experts"
  std::shared_ptr<llama::Mlp> shared_experts;  // width shared_experts x hidden, or null
  at::Tensor expert_bias;  // balance = "bias": [E] fp32 buffer "expert_bias"; else undefined

 private:
  // Under sequence parallel with experts split over the tensor ranks: their outputs arrive partial.
  bool partial_experts() const { return tensor_group_ && routed_experts->down_proj->shard.parts > 1; }
  // Figures of the training forwards since the last report (recomputations count, the forwards
  // they replace ran without gradients and do not).
  struct Counts {
    double exchanged_bytes = 0;  // expert parallel: sent to other ranks, forward and backward
    int64_t forwards = 0;
  };
  // The routed experts' weighted sum for each token, from its assignments (choice-major:
  // expert, token, routing weight; with a capacity `keep` says which stay): the kept rows sorted
  // by expert (one read of their counts), or every expert's C slots (expert_rows = "padded":
  // `places` in their queues, no read). `dropped` is set to the dropped count with a capacity.
  at::Tensor packed_routed_output(const at::Tensor& tokens, at::Tensor expert, at::Tensor token, at::Tensor weight,
                                  const at::Tensor& keep, const at::Tensor& sizes_on_device, at::Tensor& dropped);
  at::Tensor padded_routed_output(const at::Tensor& tokens, const at::Tensor& expert, const at::Tensor& token, const at::Tensor& weight,
                                  const at::Tensor& keep, const at::Tensor& places, int64_t capacity, const at::Tensor& sizes_on_device,
                                  at::Tensor& dropped);
  // Routed rows times their routing weights, in `out_type` (see the .cpp for sequence parallel).
  at::Tensor weighted(const at::Tensor& routed, const at::Tensor& routing_weight, at::ScalarType out_type) const;
  // The experts' outputs for rows sorted by (global) expert, group_sizes per expert: computed
  // here, or by the ranks holding them under expert parallel, `received` being the rows each
  // source sends this rank per local expert ([source, local expert], exchanged in forward).
  at::Tensor run_experts(const at::Tensor& rows, const std::vector<int64_t>& group_sizes, const std::vector<int64_t>& received);
  // The experts' outputs for E x C rows, expert-major: computed here, or under expert parallel by
  // the ranks holding them (all-to-alls of L C rows per rank, no counts exchanged).
  at::Tensor run_padded_experts(const at::Tensor& rows, int64_t capacity);
  // Each choice-major assignment's place in its expert's queue over the micro-batch's window:
  // `expert` [k B T] for this rank's B x T tokens. Under context parallel the queue spans every
  // rank's tokens: the assignments' keys (choice, sequence, window position) are gathered over
  // the context group and ranked together, as one process ranks them.
  at::Tensor queue_places(const at::Tensor& expert, int64_t batch, int64_t tokens_per_sequence) const;
  // The balance and z losses of the training forwards since the last device report, summed in
  // fp64 on the device, and their assignments: [dropped, routed, kept per expert...]; after the
  // step (after_optimizer_step) the assignments are summed and the losses averaged over every
  // rank's tokens, so the figures are the whole batch's, as one process counts them.
  // With balance = "bias", the busiest expert's load over the mean, summed over the bias updates.
  struct DeviceCounts {
    at::Tensor aux, z, assignments, max_load;
    int64_t forwards = 0, bias_updates = 0;
  };
  MoeSettings settings_;
  Counts counts_;
  DeviceCounts device_counts_;
  Communicator* expert_group_ = nullptr;
  Communicator* context_group_ = nullptr;
  Communicator* tensor_group_ = nullptr;  // under sequence parallel
  at::Tensor step_selections_;  // balance = "bias": top-k selections of this step's training forwards, per expert
};

}  // namespace strata::models
