// The mixture-of-experts layer: routing, grouped expert computation, auxiliary losses (moe_layer.h).
#include "moe_layer.h"

#include <cmath>
#include <map>

#include "strata/dist.h"

namespace strata::models {

namespace {
constexpr double kDefaultBiasUpdateRate = 0.001;  // DeepSeek-V3's gamma
constexpr int64_t kTokenDim = -2;  // activations are [.., tokens, features]

// x in the forward; in the backward, the gradient of this rank's tokens only (zeros elsewhere).
at::Tensor own_tokens_gradient(const at::Tensor& x, const Communicator& tensor_group) {
  const int64_t tokens = x.size(kTokenDim), share = tokens / tensor_group.size(), start = share * tensor_group.rank();
  return at::cat({x.narrow(kTokenDim, 0, start).detach(), x.narrow(kTokenDim, start, share),
                  x.narrow(kTokenDim, start + share, tokens - start - share).detach()},
                 kTokenDim);
}

// How many of `expert`'s entries name each expert (counting only those `keep` holds, if given), on
// the device. Not at::bincount: on a GPU it reads its input's minimum and maximum on the host.
at::Tensor count_per_expert(const at::Tensor& expert, int64_t n_experts, const at::Tensor& keep = at::Tensor()) {
  const at::Tensor ones = keep.defined() ? keep.to(at::kLong) : at::ones_like(expert, expert.options().dtype(at::kLong));
  return at::zeros({n_experts}, ones.options()).scatter_add_(0, expert, ones);
}
}  // namespace

Schema& add_moe_keys(Schema& schema) {
  return schema.integer("n_experts", 8, "Routed experts per MoE layer", between(1, 1 << 16))
      .integer("top_k", 2, "Experts each token is routed to (their weights renormalised to sum to 1)", between(1, 1 << 16))
      .integer("moe_every", 1, "Every n-th block has an MoE MLP (blocks n-1, 2n-1, ...); the others a dense SwiGLU", between(1, 1 << 14))
      .integer("shared_experts", 0, "Always-on experts added to the routed output (DeepSeekMoE), as one SwiGLU of that many widths",
               between(0, 1 << 10))
      .real("capacity_factor", 0.0,
            "Tokens an expert takes per micro-batch: ceil(factor x top_k x tokens / n_experts), the rest dropped; 0 = dropless",
            between(0, 1 << 10))
      .string("expert_rows", "packed",
              "With capacity_factor > 0, how the kept rows reach the experts: \"packed\" (only the kept rows: their counts read "
              "to the host each forward) or \"padded\" (every expert C rows, empty ones zero: static shapes, nothing read to the "
              "host in a step, equal all-to-all splits under expert parallel, the empty slots computed and sent too)",
              {"packed", "padded"})
      .real("router_aux_loss_coef", 0.001, "Weight of the load-balancing loss (Switch Transformer's, mean over MoE layers)",
            between(0, 1e6))
      .real("router_z_loss_coef", 0.0, "Weight of the router z-loss (ST-MoE's, mean over MoE layers)", between(0, 1e6))
      .string("balance", "aux_loss",
              "How expert loads are balanced: \"aux_loss\" (the load-balancing loss alone) or \"bias\" (DeepSeek-V3: a per-expert "
              "bias on the selection scores, moved after each step towards the mean load; the loss still applies with "
              "router_aux_loss_coef, 0 for V3's auxiliary-loss-free recipe)",
              {"aux_loss", "bias"})
      .real("bias_update_rate", kDefaultBiasUpdateRate, "balance = \"bias\": the bias step gamma per optimizer step (DeepSeek-V3: 0.001)",
            between(0, 1e3));
}

void validate_moe(const Config& config, const SourcePos& section, Diagnostics& diagnostics) {
  if (config.get_int("top_k") > config.get_int("n_experts"))
    diagnostics.error(section, "[model] top_k (" + std::to_string(config.get_int("top_k")) + ") must not exceed n_experts (" +
                                   std::to_string(config.get_int("n_experts")) + ")");
  if (config.get_int("moe_every") > config.get_int("n_layer"))
    diagnostics.error(section, "[model] moe_every (" + std::to_string(config.get_int("moe_every")) + ") exceeds n_layer (" +
                                   std::to_string(config.get_int("n_layer")) + "): the model would have no MoE block");
  if (config.get_string("expert_rows") == "padded" && config.get_float("capacity_factor") == 0)
    diagnostics.error(config.entry("expert_rows").pos,
                      "[model] expert_rows = \"padded\" needs a capacity_factor > 0 (dropless routing has no capacity to pad to)");
  // A saved strategy.toml states every key, defaults included: only a rate other than the
  // default is a choice that nothing would honour.
  if (config.get_string("balance") != "bias" && config.get_float("bias_update_rate") != kDefaultBiasUpdateRate)
    diagnostics.error(config.entry("bias_update_rate").pos, "[model] bias_update_rate applies only to balance = \"bias\"");
}

namespace {
constexpr std::pair<const char*, const char*> kHubProjections[] = {{"gate_proj", "w1"}, {"up_proj", "w3"}, {"down_proj", "w2"}};
const std::string kExperts = ".block_sparse_moe.experts.";
}  // namespace

std::vector<std::string> hub_expert_names(const std::string& stacked_name, int64_t experts) {
  std::vector<std::string> out;
  for (const auto& [ours, hub] : kHubProjections)
    if (const size_t at = stacked_name.find(kExperts + ours + ".weight"); at != std::string::npos)
      for (int64_t j = 0; j < experts; ++j) out.push_back(stacked_name.substr(0, at) + kExperts + std::to_string(j) + "." + hub + ".weight");
  return out;
}

NamedTensors hub_experts_from_stacked(const NamedTensors& tensors) {
  NamedTensors out;
  for (const auto& [name, tensor] : tensors) {
    const auto hub = hub_expert_names(name, tensor.size(0));
    for (size_t j = 0; j < hub.size(); ++j)
      out.emplace_back(hub[j], tensor[static_cast<int64_t>(j)]);  // a view: the slices do not overlap
    if (hub.empty()) out.emplace_back(name, tensor);
  }
  return out;
}

NamedTensors stacked_from_hub_experts(const NamedTensors& tensors, int64_t experts) {
  NamedTensors out;
  std::map<std::string, std::vector<at::Tensor>> stacks;  // stacked name -> one tensor per expert
  for (const auto& [name, tensor] : tensors) {
    const size_t at = name.find(kExperts);
    if (at == std::string::npos) {
      out.emplace_back(name, tensor);
      continue;
    }
    // ...experts.J.wX.weight
    const std::string rest = name.substr(at + kExperts.size());
    const size_t dot = rest.find('.');
    std::string ours;
    for (const auto& [mine, hub] : kHubProjections)
      if (dot != std::string::npos && rest.substr(dot + 1) == std::string(hub) + ".weight") ours = mine;
    int64_t j = -1;
    try {
      j = std::stoll(rest.substr(0, dot));
    } catch (const std::exception&) {
    }
    if (ours.empty() || j < 0 || j >= experts)
      throw UserError("Hugging Face tensor '" + name + "' is not an expert of a " + std::to_string(experts) + "-expert MixtralForCausalLM");
    auto& stack = stacks[name.substr(0, at) + kExperts + ours + ".weight"];
    stack.resize(static_cast<size_t>(experts));
    stack[static_cast<size_t>(j)] = tensor;
  }
  for (auto& [name, stack] : stacks) {
    for (size_t j = 0; j < stack.size(); ++j)
      if (!stack[j].defined()) throw UserError("Hugging Face checkpoint lacks expert " + std::to_string(j) + " of '" + name + "'");
    out.emplace_back(name, at::stack(stack));
  }
  return out;
}

void require_hub_mixtral(const Config& c) {
  if (c.get_int("moe_every") != 1) throw UserError("MixtralForCausalLM has an MoE MLP in every block; [model] moe_every must be 1");
  if (c.get_int("shared_experts") != 0) throw UserError("MixtralForCausalLM has no shared experts; [model] shared_experts must be 0");
  if (c.get_float("capacity_factor") != 0) throw UserError("MixtralForCausalLM routes without capacity; [model] capacity_factor must be 0");
  if (c.get_string("balance") != "aux_loss")
    throw UserError("MixtralForCausalLM selects experts by probability alone; [model] balance must be \"aux_loss\" (not a selection bias)");
}

bool is_moe_layer(const Config& config, int64_t layer) { return (layer + 1) % config.get_int("moe_every") == 0; }
int64_t moe_layer_count(const Config& config) { return config.get_int("n_layer") / config.get_int("moe_every"); }

MoeSettings MoeSettings::from(const Config& c) {
  MoeSettings s;
  s.experts = c.get_int("n_experts"), s.top_k = c.get_int("top_k"), s.shared_experts = c.get_int("shared_experts");
  s.capacity_factor = c.get_float("capacity_factor");
  s.expert_rows = c.get_string("expert_rows");
  s.aux_loss_coef = c.get_float("router_aux_loss_coef"), s.z_loss_coef = c.get_float("router_z_loss_coef");
  s.moe_layers = moe_layer_count(c);
  s.bias_balance = c.get_string("balance") == "bias", s.bias_update_rate = c.get_float("bias_update_rate");
  return s;
}

GroupedExperts::GroupedExperts(int64_t experts, int64_t d_model, int64_t hidden, nn::TensorShard shard) {
  using nn::ParallelStyle;
  gate_proj = register_module("gate_proj", std::make_shared<nn::GroupedLinear>(experts, d_model, hidden, 0.02, ParallelStyle::Column, shard));
  up_proj = register_module("up_proj", std::make_shared<nn::GroupedLinear>(experts, d_model, hidden, 0.02, ParallelStyle::Column, shard));
  down_proj = register_module("down_proj", std::make_shared<nn::GroupedLinear>(experts, hidden, d_model, 0.02, ParallelStyle::Row, shard));
}

at::Tensor GroupedExperts::forward(const at::Tensor& x, at::IntArrayRef group_sizes) {
  return down_proj->forward(ops::swiglu(gate_proj->forward(x, group_sizes), up_proj->forward(x, group_sizes)), group_sizes);
}

MoeLayer::MoeLayer(const MoeSettings& settings, int64_t d_model, int64_t hidden, nn::TensorShard shard) : settings_(settings) {
  gate = register_module("gate", std::make_shared<nn::Linear>(d_model, settings.experts, false));
  routed_experts = register_module("experts", std::make_shared<GroupedExperts>(settings.experts, d_model, hidden, shard));
  if (settings.shared_experts > 0)
    shared_experts = register_module("shared_experts", std::make_shared<llama::Mlp>(d_model, settings.shared_experts * hidden, shard));
  if (settings.bias_balance) {
    expert_bias = register_buffer("expert_bias", at::zeros({settings.experts}, at::kFloat));
    step_selections_ = at::zeros({settings.experts}, at::kLong);
  }
}

at::Tensor MoeLayer::queue_places(const at::Tensor& expert, int64_t batch, int64_t tokens_per_sequence) const {
  const int64_t n_experts = settings_.experts;
  const auto places_in_order = [&](const at::Tensor& e) {
    const at::Tensor one_hot = at::one_hot(e, n_experts);
    return (one_hot.cumsum(0) * one_hot).sum(1) - 1;
  };
  if (!context_group_ || context_group_->size() <= 1) return places_in_order(expert);
  const int ranks = context_group_->size();
  const int64_t n = batch * tokens_per_sequence, assignments = expert.size(0);
  const nn::SequenceLayout& sequence = nn::current_sequence();
  const int64_t window = sequence.window > 0 ? sequence.window : tokens_per_sequence * ranks;
  // One process's order: choice, then sequence, then window position.
  const at::Tensor local = at::arange(assignments, expert.options());
  const at::Tensor token = local.remainder(n), position = sequence.index(tokens_per_sequence, expert.device());
  const at::Tensor key = local.div(n, "floor") * (batch * window) + token.div(tokens_per_sequence, "floor") * window +
                         position.index_select(0, token.remainder(tokens_per_sequence));
  at::Tensor keys = at::empty({ranks * assignments}, key.options()), experts = at::empty({ranks * assignments}, expert.options());
  context_group_->all_gather(keys, key.contiguous())->wait();
  context_group_->all_gather(experts, expert.contiguous())->wait();
  const at::Tensor order = std::get<1>(keys.sort());
  at::Tensor places = at::empty_like(keys);
  places.index_put_({order}, places_in_order(experts.index_select(0, order)));
  return places.narrow(0, context_group_->rank() * assignments, assignments);
}

at::Tensor MoeLayer::forward(const at::Tensor& x) {
  const int64_t n_experts = settings_.experts, k = settings_.top_k;
  const at::Tensor tokens = (tensor_group_ ? own_tokens_gradient(x, *tensor_group_) : x).reshape({-1, x.size(-1)});
  const int64_t n = tokens.size(0);
  const at::Tensor logits = gate->forward(tokens).to(at::kFloat);
  const at::Tensor probs = logits.softmax(-1);
  at::Tensor top_weights, top_experts;
  if (expert_bias.defined()) {  // the bias picks the experts; their weights stay the router's probabilities
    top_experts = std::get<1>((probs + expert_bias.to(probs.device())).topk(k, -1));
    top_weights = probs.gather(-1, top_experts);
  } else {
    std::tie(top_weights, top_experts) = probs.topk(k, -1);
  }
  top_weights = top_weights / top_weights.sum(-1, /*keepdim=*/true);

  // Assignments choice-major: every token's first choice, then every second choice, ...
  at::Tensor expert = top_experts.t().reshape(-1);
  at::Tensor token = at::arange(n, expert.options()).repeat({k});
  at::Tensor weight = top_weights.t().reshape(-1);
  const at::Tensor selections = count_per_expert(expert, n_experts);  // before capacity: the balance loss's f
  at::Tensor keep, places;  // with a capacity: the assignments that stay, and each one's place in its expert's queue
  int64_t capacity = 0;
  if (settings_.capacity_factor > 0) {
    const int64_t window_ranks = context_group_ ? context_group_->size() : 1;  // capacity over the whole window
    capacity = static_cast<int64_t>(
        std::ceil(settings_.capacity_factor * static_cast<double>(k * n * window_ranks) / static_cast<double>(n_experts)));
    places = queue_places(expert, x.size(0), n / x.size(0));
    keep = places.lt(capacity);
  }
  const at::Tensor sizes_on_device = keep.defined() ? count_per_expert(expert, n_experts, keep) : selections;
  at::Tensor dropped;  // with a capacity: how many assignments were dropped, on the device
  at::Tensor out = keep.defined() && settings_.expert_rows == "padded"
                       ? padded_routed_output(tokens, expert, token, weight, keep, places, capacity, sizes_on_device, dropped)
                       : packed_routed_output(tokens, expert, token, weight, keep, sizes_on_device, dropped);

  // Switch's balance loss and the z-loss, each this layer's share of the mean over MoE layers.
  at::Tensor window_selections = selections.to(at::kFloat);
  double window_tokens = static_cast<double>(n);
  if (context_group_ && context_group_->size() > 1) {  // f over the whole window (see moe_layer.h)
    context_group_->all_reduce(window_selections, ReduceOp::Sum)->wait();
    window_tokens *= context_group_->size();
  }
  const at::Tensor aux = static_cast<double>(n_experts) * (window_selections / window_tokens * probs.mean(0)).sum();
  const at::Tensor z = logits.logsumexp(-1).pow(2).mean();
  const double per_layer = 1.0 / static_cast<double>(settings_.moe_layers);
  at::Tensor objective;
  if (settings_.aux_loss_coef > 0) objective = aux * (settings_.aux_loss_coef * per_layer);
  if (settings_.z_loss_coef > 0) objective = objective.defined() ? objective + z * (settings_.z_loss_coef * per_layer) : z * (settings_.z_loss_coef * per_layer);
  if (objective.defined()) out = nn::add_auxiliary_loss(out, objective);

  if (at::GradMode::is_enabled()) {  // a training forward, or the recomputation of one
    at::Tensor& assignments = device_counts_.assignments;
    if (!assignments.defined()) assignments = at::zeros({2 + n_experts}, sizes_on_device.options().dtype(at::kDouble));
    if (dropped.defined()) assignments.narrow(0, 0, 1).add_(dropped.to(assignments.device()));
    assignments.narrow(0, 1, 1).add_(static_cast<double>(k * n));
    assignments.narrow(0, 2, n_experts).add_(sizes_on_device);
    ++counts_.forwards;
    const at::Tensor aux_sum = aux.detach().to(at::kDouble), z_sum = z.detach().to(at::kDouble);
    device_counts_.aux = device_counts_.aux.defined() ? device_counts_.aux + aux_sum : aux_sum;
    device_counts_.z = device_counts_.z.defined() ? device_counts_.z + z_sum : z_sum;
    ++device_counts_.forwards;
    if (step_selections_.defined()) step_selections_ += selections.to(step_selections_.device());
  }
  out = out.view(x.sizes());
  if (partial_experts()) out = dist::reduce_scatter_along(out, kTokenDim, *tensor_group_);  // this rank's tokens, summed
  else if (tensor_group_) out = dist::scatter_along(out, kTokenDim, *tensor_group_);  // this rank's tokens
  return shared_experts ? out + shared_experts->forward(x) : out;
}

void MoeLayer::after_optimizer_step(Communicator& token_ranks) {
  // The step's figures over every rank's tokens, on the device (read when figures are), in one
  // all-reduce: the assignments summed, the balance and z losses averaged (every rank ran as many
  // micro-batches, so the mean of the ranks' means is one process's mean over the whole batch).
  DeviceCounts& c = device_counts_;
  if (c.forwards > 0 && token_ranks.size() > 1) {
    std::vector<at::Tensor> parts{c.aux.reshape({1}), c.z.reshape({1})};
    if (c.assignments.defined()) parts.push_back(c.assignments);
    at::Tensor all = at::cat(parts);
    token_ranks.all_reduce(all, ReduceOp::Sum)->wait();
    const double ranks = static_cast<double>(token_ranks.size());
    c.aux = all[0] / ranks, c.z = all[1] / ranks;
    if (c.assignments.defined()) c.assignments = all.narrow(0, 2, c.assignments.size(0));
  }
  if (!expert_bias.defined()) return;
  // Selections of every rank's tokens this step (exact integers, so every rank moves alike and
  // as one process over the whole batch would), then b_i += gamma sign(mean - load_i).
  // All on the device: the busiest expert's load over the mean joins the step's device figures.
  at::Tensor load = step_selections_.to(at::kDouble);
  if (token_ranks.size() > 1) token_ranks.all_reduce(load, ReduceOp::Sum)->wait();
  step_selections_.zero_();
  if (c.forwards == 0) return;  // no training forward this step (the same on every rank)
  const at::Tensor mean = load.mean(), ratio = load.max() / mean;
  c.max_load = c.max_load.defined() ? c.max_load + ratio : ratio;
  ++c.bias_updates;
  at::NoGradGuard no_grad;
  expert_bias.add_((mean - load).sign().to(expert_bias.scalar_type()), settings_.bias_update_rate);
}

void MoeLayer::split_experts(Communicator& group) {
  const nn::TensorShard shard{group.size(), group.rank()};
  for (auto* layer : {routed_experts->gate_proj.get(), routed_experts->up_proj.get(), routed_experts->down_proj.get()}) layer->keep_groups(shard);
  expert_group_ = &group;
}


// Under sequence parallel with split experts the routed rows are this tensor rank's addends
// (tensor_parallel leaves the Row experts' outputs partial: nn::SumsRowSplitOutputs): the
// weighted sum is summed by the reduce-scatter after the layer, and each routing weight's
// gradient, a dot product with the partial row, is summed over the tensor ranks (copy_to_group),
// so the router's gradient is whole and alike on every rank.
at::Tensor MoeLayer::weighted(const at::Tensor& routed, const at::Tensor& routing_weight, at::ScalarType out_type) const {
  at::Tensor routing = routing_weight.unsqueeze(1);
  if (partial_experts()) routing = dist::copy_to_group(routing, *tensor_group_);
  return (routed * routing.to(routed.scalar_type())).to(out_type);
}

at::Tensor MoeLayer::packed_routed_output(const at::Tensor& tokens, at::Tensor expert, at::Tensor token, at::Tensor weight,
                                          const at::Tensor& keep, const at::Tensor& sizes_on_device, at::Tensor& dropped) {
  const int64_t n_experts = settings_.experts;
  // The rows each expert takes, which the grouped GEMM and the all-to-all need on the host: the
  // forward's one read (read_on_host, counted), and it also says how many assignments stay.
  // Under expert parallel the counts every rank sends this one are exchanged first, on the
  // device, and come in the same read.
  const bool exchanges = expert_group_ && expert_group_->size() > 1;
  at::Tensor received_sizes;
  if (exchanges) {
    received_sizes = at::empty_like(sizes_on_device);
    expert_group_->all_to_all(received_sizes, sizes_on_device, {}, {})->wait();
  }
  const std::vector<double> sizes = read_on_host({sizes_on_device, received_sizes});
  const std::vector<int64_t> group_sizes(sizes.begin(), sizes.begin() + n_experts);
  const std::vector<int64_t> received_counts(exchanges ? sizes.begin() + n_experts : sizes.end(), sizes.end());
  if (keep.defined()) {
    int64_t kept_count = 0;
    for (int64_t size : group_sizes) kept_count += size;
    dropped = at::scalar_tensor(static_cast<double>(expert.size(0) - kept_count), sizes_on_device.options().dtype(at::kDouble));
    const at::Tensor kept = at::nonzero_static(keep, kept_count).squeeze(1);  // its size known: no second wait
    expert = expert.index_select(0, kept), token = token.index_select(0, kept), weight = weight.index_select(0, kept);
  }
  // Sorted by expert, stably: an expert's rows keep the choice-major order.
  const at::Tensor order = std::get<1>(expert.sort(/*stable=*/true, /*dim=*/0, /*descending=*/false));
  const at::Tensor sorted_token = token.index_select(0, order);
  const at::Tensor routed = run_experts(tokens.index_select(0, sorted_token), group_sizes, received_counts);
  return at::zeros_like(tokens).index_add(0, sorted_token, weighted(routed, weight.index_select(0, order), tokens.scalar_type()));
}

at::Tensor MoeLayer::padded_routed_output(const at::Tensor& tokens, const at::Tensor& expert, const at::Tensor& token,
                                          const at::Tensor& weight, const at::Tensor& keep, const at::Tensor& places, int64_t capacity,
                                          const at::Tensor& sizes_on_device, at::Tensor& dropped) {
  // Every expert's C slots, an assignment at its place in its expert's queue and the dropped ones
  // at a spare slot past the end: static shapes, nothing read. The spare row is not computed; it
  // reads as zeros, so a dropped assignment adds nothing.
  const int64_t slots = settings_.experts * capacity;
  const at::Tensor slot = at::where(keep, expert * capacity + places, at::full_like(expert, slots));
  const at::Tensor rows = at::zeros({slots + 1, tokens.size(1)}, tokens.options()).index_copy(0, slot, tokens.index_select(0, token));
  const at::Tensor computed = run_padded_experts(rows.narrow(0, 0, slots), capacity);
  const at::Tensor with_spare = at::cat({computed, at::zeros({1, computed.size(1)}, computed.options())});
  dropped = expert.size(0) - sizes_on_device.sum();
  return at::zeros_like(tokens).index_add(0, token, weighted(with_spare.index_select(0, slot), weight, tokens.scalar_type()));
}

at::Tensor MoeLayer::run_padded_experts(const at::Tensor& rows, int64_t capacity) {
  const int64_t n_experts = settings_.experts;
  if (!expert_group_ || expert_group_->size() == 1)
    return routed_experts->forward(rows, std::vector<int64_t>(static_cast<size_t>(n_experts), capacity));
  // Rank r's experts are rows [r L C, (r+1) L C): every split is L C rows, known to every rank.
  Communicator& group = *expert_group_;
  const int64_t ranks = group.size(), local = n_experts / ranks, d = rows.size(1);
  const std::vector<int64_t> splits(static_cast<size_t>(ranks), local * capacity);
  if (at::GradMode::is_enabled())  // dispatch and combine, forward and backward: the padded rows travel too
    counts_.exchanged_bytes += 4.0 * static_cast<double>((ranks - 1) * local * capacity * d * rows.element_size());
  const at::Tensor received = nn::all_to_all_rows(group, rows, splits, splits);  // [source, local expert, C] rows
  // 1/P on the experts' output gradient (so on their weight gradients), P back on their input's.
  const double parts = static_cast<double>(ranks);
  const at::Tensor grouped = nn::scale_gradient(received.view({ranks, local, capacity, d}).transpose(0, 1).reshape({-1, d}), parts);
  at::Tensor computed = routed_experts->forward(grouped, std::vector<int64_t>(static_cast<size_t>(local), ranks * capacity));
  computed = nn::scale_gradient(computed, 1.0 / parts);
  const int64_t out_d = computed.size(1);
  const at::Tensor back = computed.view({local, ranks, capacity, out_d}).transpose(0, 1).reshape({-1, out_d});
  return nn::all_to_all_rows(group, back, splits, splits);
}

at::Tensor MoeLayer::run_experts(const at::Tensor& rows, const std::vector<int64_t>& group_sizes, const std::vector<int64_t>& counts) {
  if (!expert_group_ || expert_group_->size() == 1) return routed_experts->forward(rows, group_sizes);
  Communicator& group = *expert_group_;
  const int64_t ranks = group.size(), local = settings_.experts / ranks;
  // Rows per destination; `counts` holds every source's rows per local expert ([source, local expert]).
  std::vector<int64_t> send_rows(static_cast<size_t>(ranks), 0);
  for (int64_t e = 0; e < settings_.experts; ++e) send_rows[static_cast<size_t>(e / local)] += group_sizes[static_cast<size_t>(e)];
  std::vector<int64_t> recv_rows(static_cast<size_t>(ranks), 0);
  for (int64_t r = 0; r < ranks; ++r)
    for (int64_t l = 0; l < local; ++l) recv_rows[static_cast<size_t>(r)] += counts[r * local + l];
  // Received rows come source-major; the experts need them expert-major.
  std::vector<int64_t> starts(static_cast<size_t>(ranks * local)), by_expert, local_sizes(static_cast<size_t>(local), 0);
  for (int64_t i = 0, at_row = 0; i < ranks * local; ++i) starts[static_cast<size_t>(i)] = at_row, at_row += counts[i];
  for (int64_t l = 0; l < local; ++l)
    for (int64_t r = 0; r < ranks; ++r) {
      const int64_t first = starts[static_cast<size_t>(r * local + l)], n = counts[r * local + l];
      for (int64_t k = 0; k < n; ++k) by_expert.push_back(first + k);
      local_sizes[static_cast<size_t>(l)] += n;
    }
  const at::Tensor order = at::tensor(by_expert, at::kLong).to(rows.device());
  if (at::GradMode::is_enabled()) {
    // Rows to others in dispatch (S) and back in combine (R); backward sends S and R again.
    const int64_t me = group.rank();
    double others = 0;
    for (int64_t r = 0; r < ranks; ++r)
      if (r != me) others += static_cast<double>(send_rows[static_cast<size_t>(r)] + recv_rows[static_cast<size_t>(r)]);
    counts_.exchanged_bytes += 2 * others * static_cast<double>(rows.size(1) * rows.element_size());
  }
  const at::Tensor received = nn::all_to_all_rows(group, rows, send_rows, recv_rows);
  // 1/P on the experts' output gradient (so on their weight gradients), P back on their input's.
  const double parts = static_cast<double>(ranks);
  at::Tensor grouped = nn::scale_gradient(received.index_select(0, order), parts);
  at::Tensor computed = nn::scale_gradient(routed_experts->forward(grouped, local_sizes), 1.0 / parts);
  const at::Tensor back = at::empty_like(order).index_copy_(0, order, at::arange(order.size(0), order.options()));
  return nn::all_to_all_rows(group, computed.index_select(0, back), recv_rows, send_rows);
}

void MoeLayer::report_device_metrics(std::vector<std::pair<std::string, at::Tensor>>& out) {
  if (device_counts_.forwards == 0) return;
  // Means over micro-batches, each this layer's share of the mean over MoE layers (as above).
  const double share = 1.0 / static_cast<double>(settings_.moe_layers), forwards = static_cast<double>(device_counts_.forwards);
  out.emplace_back("moe_aux_loss", device_counts_.aux / forwards * share);
  out.emplace_back("moe_z_loss", device_counts_.z / forwards * share);
  if (const at::Tensor& a = device_counts_.assignments; a.defined()) {
    out.emplace_back("moe_dropped_fraction", a[0] / a[1] * share);
    for (int64_t e = 0; e + 2 < a.size(0); ++e) out.emplace_back("moe_tokens_e" + std::to_string(e), a[2 + e]);
  }
  if (device_counts_.bias_updates > 0)
    out.emplace_back("moe_max_load_ratio", device_counts_.max_load / static_cast<double>(device_counts_.bias_updates) * share);
  device_counts_ = DeviceCounts{};
}

void MoeLayer::report_metrics(std::vector<std::pair<std::string, double>>& out) {
  if (counts_.forwards == 0) return;
  if (expert_group_ && expert_group_->size() > 1) out.emplace_back("moe_all_to_all_bytes", counts_.exchanged_bytes);
  counts_ = Counts{};
}

}  // namespace strata::models
