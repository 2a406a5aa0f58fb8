// Context parallel over [parallel] context: every window's tokens are split over the context
// ranks (sequence_split.h: zigzag chunks i and 2c-1-i), and attention — the one layer that mixes
// tokens — runs over the split sequence (context_attention.h: Ulysses, ring or both). Everything
// else in a transformer is per token, so it runs on this rank's tokens unchanged. What the pass
// changes in the step:
//   split_batch     keeps this rank's tokens of each micro-batch (inputs, targets, positions);
//                   the layout's token_index says where they sit, documents stay whole (keys
//                   from other ranks are masked by them)
//   attention       every nn::AttentionCore computes through ContextAttention
//   loss            unchanged: each rank's mean over its tokens; ranks hold equal numbers of
//                   tokens, so core's reduce_loss (mean over data x context) is the window's mean
//   sync_gradients  wrapped: after the data-parallel pass has made gradients agree over the data
//                   group, one all-reduce averages them over the context group (each rank's
//                   gradient is that of its tokens' mean), also in a backward left
//                   unsynchronised (WSAM's local pass)
//   evaluate        wrapped: the validation loss averaged over the context group
//   statistics      layers that compute a statistic over the window's tokens (a mixture of
//                   experts' balance loss and capacity, nn::SequenceStatisticsLayer) get the
//                   context group
#include <numeric>
#include <sstream>

#include <ATen/ATen.h>

#include "context_attention.h"
#include "sequence_split.h"
#include "strata/dist.h"
#include "strata/job.h"
#include "strata/plugin.h"

namespace strata::context_parallel {
namespace {

// The method a strategy resolves to for a model and mesh.
struct Method {
  std::string name;       // ulysses, ring or 2d
  int ulysses = 1, ring = 1;  // u x r = c
  std::string why, problem;
};

Method resolve_method(const Config& config, const Config& model, const MeshSizes& mesh) {
  Method m;
  const int c = static_cast<int>(mesh.context);
  const std::string asked = config.get_string("method");
  const int64_t heads = model.has("n_head") ? model.get_int("n_head") / mesh.tensor : 0;
  const std::string heads_text = std::to_string(heads) + " attention heads per rank" + (mesh.tensor > 1 ? " (after tensor parallel)" : "");
  if (asked == "ring") {
    m = {"ring", 1, c, "asked for", ""};
  } else if (asked == "ulysses") {
    m = {"ulysses", c, 1, "asked for", ""};
    if (heads == 0) m.problem = "pass 'context_parallel': method \"ulysses\" splits attention heads, but [model] has no n_head";
    else if (heads % c != 0)
      m.problem = "pass 'context_parallel': method \"ulysses\" needs the " + heads_text + " to divide by [parallel] context = " +
                  std::to_string(c) + "; use method = \"2d\" or \"ring\"";
  } else if (asked == "2d") {
    int u = static_cast<int>(config.get_int("ulysses_size"));
    if (u == 0) u = heads > 0 ? std::gcd(static_cast<int>(heads), c) : 1;
    m = {"2d", u, c / u, config.get_int("ulysses_size") > 0 ? "ulysses_size asked for" : "the largest Ulysses size the heads allow", ""};
    if (c % u != 0)
      m.problem = "pass 'context_parallel': ulysses_size = " + std::to_string(u) + " does not divide [parallel] context = " + std::to_string(c);
    else if (u > 1 && heads % u != 0)
      m.problem = "pass 'context_parallel': ulysses_size = " + std::to_string(u) + " does not divide the " + heads_text;
  } else {  // auto: Ulysses where the heads allow (less traffic, no per-step latency), else the most of it
    const int u = heads > 0 ? std::gcd(static_cast<int>(heads), c) : 1;
    if (u == c) m = {"ulysses", c, 1, "auto: the " + heads_text + " divide by context = " + std::to_string(c), ""};
    else if (u > 1) m = {"2d", u, c / u, "auto: the " + heads_text + " divide by " + std::to_string(u) + " but not by " + std::to_string(c), ""};
    else m = {"ring", 1, c, "auto: the " + heads_text + " share no factor with context = " + std::to_string(c), ""};
  }
  if (config.get_int("ulysses_size") > 0 && asked != "2d" && m.problem.empty())
    m.problem = "pass 'context_parallel': ulysses_size applies to method = \"2d\" only (method is \"" + asked + "\")";
  return m;
}

SequenceSplit split_of(const Config& config, int64_t window, int ranks) {
  return {window, ranks, config.get_string("load_balance") == "zigzag"};
}

// What ring_backward resolves to where the blocks compute: "auto" rotates where an
// attention_backward implementation other than the reference (which writes out every chunk
// pair's [Tq, Tk] scores) serves the device and dtype.
std::string ring_backward(const Config& config, c10::DeviceType device, c10::ScalarType dtype) {
  const std::string asked = config.get_string("ring_backward");
  if (asked != "auto") return asked;
  for (const auto* impl : ops::implementations(ops::AttentionBackward::name))
    if (impl->priority() > 0 && impl->support().accepts(device, dtype)) return "rotate";
  return "autograd";
}

class ContextParallelPass final : public Pass {
 public:
  ContextParallelPass()
      : Pass({ComponentKind::Pass, "context_parallel",
              "Context parallel over [parallel] context: each rank holds a share of every sequence's tokens; attention by "
              "Ulysses all-to-all, ring p2p with log-sum-exp merging, or both (2-D)",
              Schema()
                  .string("method", "auto",
                          "ulysses: all-to-all to head-split full sequences (heads must divide); ring: key/value blocks rotate "
                          "over point-to-point; 2d: Ulysses inside groups of ulysses_size ranks, ring across them; auto: "
                          "ulysses where the heads divide, else 2d with the largest size they allow, else ring",
                          {"auto", "ulysses", "ring", "2d"})
                  .integer("ulysses_size", 0, "Ranks of each Ulysses group under method = \"2d\"; 0 = the largest the heads allow",
                           at_least(0))
                  .string("load_balance", "zigzag",
                          "zigzag: rank i holds chunks i and 2c-1-i of 2c, equal causal work; contiguous: chunk i of c (to "
                          "measure the imbalance)",
                          {"zigzag", "contiguous"})
                  .string("ring_backward", "auto",
                          "How the ring (methods ring and 2d) is differentiated. rotate: it keeps only this rank's q, k, v, "
                          "output and log-sum-exp per layer; backward rotates the key/value blocks again and runs the "
                          "attention_backward operator per block. autograd: autograd keeps every key/value block seen and "
                          "every partial result (about (2(r-1) kv + 4 h) values per token and layer more, r the ring size). "
                          "auto: rotate where a fused attention_backward serves the device (CPU with the kernels plugin), "
                          "else autograd (the reference writes out each chunk pair's scores)",
                          {"auto", "rotate", "autograd"})},
             {Phase::ModelRewrite, {}, {}, {"tensor_parallel", "pipeline_parallel"}, {}},
             {{Dim::Context}, {{Stage::SyncGradients, StageUse::Wrap}, {Stage::Evaluate, StageUse::Wrap}}}) {}

  std::string size_problem(const Config& config, const Config& model, const MeshSizes& mesh) const override {
    if (mesh.context < 2) return "pass 'context_parallel' needs [parallel] context >= 2 (it is " + std::to_string(mesh.context) + ")";
    if (!model.has("seq_len")) return "pass 'context_parallel' splits [model] seq_len, which this model does not declare";
    const SequenceSplit split = split_of(config, model.has("seq_len") ? model.get_int("seq_len") : 0, static_cast<int>(mesh.context));
    const int64_t pieces = (split.zigzag ? 2 : 1) * mesh.context;
    if (split.window % pieces != 0)
      return "pass 'context_parallel': [model] seq_len " + std::to_string(split.window) + " must divide into " + std::to_string(pieces) +
             " chunks (" + (split.zigzag ? "2 x " : "") + "[parallel] context = " + std::to_string(mesh.context) + ")";
    return resolve_method(config, model, mesh).problem;
  }

  std::string describe_plan(const Config& config, const PlanFacts& facts) const override {
    const Method m = resolve_method(config, facts.model, facts.mesh);
    if (!m.problem.empty()) return {};
    const SequenceSplit split = split_of(config, facts.model.get_int("seq_len"), static_cast<int>(facts.mesh.context));
    std::ostringstream out;
    out << "Context parallel: method " << m.name;
    if (m.name == "2d") out << " (Ulysses groups of " << m.ulysses << " x ring of " << m.ring << ")";
    out << ", " << m.why << ".\n  Each rank holds " << split.window / split.ranks << " of " << split.window << " tokens per sequence: ";
    if (split.zigzag) out << "chunks i and " << 2 * split.ranks - 1 << "-i of " << 2 * split.ranks << " (zigzag, " << split.chunk_length() << " tokens each)\n";
    else out << "chunk i of " << split.ranks << " (contiguous: causal work grows with i)\n";
    out << "  Per attention layer and micro-batch of B sequences, h = heads x head_dim, each rank sends\n";
    if (m.ulysses > 1) out << "    Ulysses: 4 all-to-alls of B x " << split.window / split.ranks << " x h (q, k, v, output; k and v at kv width), "
                              "the same again in backward\n";
    if (m.ring > 1) {
      const bool rotate = ring_backward(config, facts.device, facts.compute_dtype) == "rotate";
      out << "    ring: " << m.ring - 1 << " key/value block" << (m.ring > 2 ? "s" : "") << " of 2 x B x " << split.window / m.ring << " x h_kv"
          << (m.ulysses > 1 ? "/" + std::to_string(m.ulysses) : "") << " forward, "
          << (rotate ? "the same blocks again and as many gradient blocks backward\n" : "as many gradient blocks backward\n");
      out << "  The ring " << (rotate ? "keeps q, k, v, the output and its log-sum-exp per layer; backward runs attention_backward per block (ring_backward rotate"
                                      : "keeps every key/value block seen and every partial result per layer (ring_backward autograd")
          << (config.get_string("ring_backward") == "auto" ? ", by auto" : "") << ")\n";
    }
    return out.str();
  }

  // Each rank holds 1/c of every sequence's tokens: activations, logits and FLOPs (its queries
  // against all keys) divide by c (the rotating ring keeps exactly one process's layer: measured
  // to 0.1% at context 2 and 3, GPT d256). Per layer and micro-batch, Ulysses sends (u-1)/u of q, k, v and
  // the output forward and of their gradients backward; the ring passes r-1 key/value blocks
  // forward and their gradients backward, and when it rotates in backward the blocks again;
  // differentiated by autograd, it keeps the blocks and partial results instead (2 (r-1) kv + 4 h
  // values per own token and layer: measured 6.1 h at r = 2 and 11.0 h at r = 4, GPT d256, where
  // this counts 6 h and 10 h).
  void estimate(const Config& config, const PlanFacts& facts, CostEstimate& c) const override {
    const double cp = static_cast<double>(c.context);
    c.activation_bytes /= cp, c.transient_bytes /= cp, c.flops /= cp;
    if (c.model.heads <= 0) return;
    const Method m = resolve_method(config, facts.model, facts.mesh);
    if (!m.problem.empty()) return;
    const double u = m.ulysses, r = m.ring, h = static_cast<double>(c.model.hidden) / static_cast<double>(c.tensor);
    const double kv_width = h * static_cast<double>(c.model.kv_heads) / static_cast<double>(c.model.heads);
    const double tokens = c.seq_per_rank * static_cast<double>(c.micro_batch);  // a micro-batch's, on this rank
    const double per_layer = c.layers_per_rank * static_cast<double>(c.micro_batches);
    if (u > 1) {
      c.comm_bytes += per_layer * 2 * (u - 1) / u * (2 * h + 2 * kv_width) * tokens * c.activation_element_bytes;
      c.messages += per_layer * 8;
      // The attention's saved output is in the group's window order over 1/u of the heads; the
      // output projection keeps its own copy in this rank's tokens (measured 1.04h per own token
      // and layer more than the ring at context 2, GPT d256).
      c.activation_bytes += c.layers_per_rank * h * tokens * c.activation_element_bytes;
    }
    if (r > 1) {
      const bool rotate = ring_backward(config, facts.device, facts.compute_dtype) == "rotate";
      const double blocks = (rotate ? 3 : 2) * (r - 1);
      c.comm_bytes += per_layer * blocks * 2 * kv_width * tokens * c.activation_element_bytes;
      c.messages += per_layer * blocks * 2;  // each exchanges with both neighbours
      if (!rotate) c.activation_bytes += c.layers_per_rank * (2 * (r - 1) * kv_width + 4 * h) * tokens * c.activation_element_bytes;
    }
  }

  void apply(Job& job, const Config& config) const override {
    Communicator& group = job.topology->group(Dim::Context);
    const int c = group.size();
    const MeshSizes mesh{job.topology->size(Dim::Data), job.topology->size(Dim::Tensor), job.topology->size(Dim::Pipeline), c, 1};
    const Method method = resolve_method(config, job.model_config(), mesh);
    if (!method.problem.empty()) throw UserError(method.problem);
    const SequenceSplit split = split_of(config, job.model->seq_len(), c);
    const int rank = group.rank(), u = method.ulysses;

    // Inner (Ulysses) groups of u adjacent context ranks, and the ring across them.
    std::vector<int> inner_ranks, outer_ranks;
    for (int j = 0; j < u; ++j) inner_ranks.push_back(rank / u * u + j);
    for (int o = 0; o < c / u; ++o) outer_ranks.push_back(o * u + rank % u);
    auto inner = group.split(inner_ranks);
    auto outer = group.split(outer_ranks);
    auto attention = std::make_shared<ContextAttention>(split, rank, std::move(inner), std::move(outer),
                                                        ring_backward(config, job.device().type(), at::kFloat) == "rotate");

    job.split_batch = [whole = job.split_batch, split, rank](const at::Tensor& batch) {
      MicroBatch micro = whole(batch);
      if (micro.sequence.token_index.defined())
        throw UserError("context_parallel: the micro-batch's tokens are already split by another pass");
      const at::Tensor index = split.token_index(split.chunks_of(rank), batch.device());
      micro.inputs = micro.inputs.index_select(1, index);
      micro.targets = micro.targets.index_select(1, index);
      micro.sequence.window = split.window;
      micro.sequence.token_index = index;
      if (micro.sequence.positions.defined()) micro.sequence.positions = micro.sequence.positions.index_select(-1, index);
      return micro;
    };

    int cores = 0;
    for (const auto& item : job.model->named_modules())
      if (auto* core = dynamic_cast<nn::AttentionCore*>(item.value().get())) {
        core->attend = [attention](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ops::AttentionMask& local) {
          return attention->attend(q, k, v, local);
        };
        ++cores;
      }
    for (const auto& item : job.model->named_modules())
      if (auto* layer = dynamic_cast<nn::SequenceStatisticsLayer*>(item.value().get())) layer->split_sequence(group);
    if (cores == 0)
      throw UserError("context_parallel: model '" + job.job_config().get_string("model") +
                      "' computes attention without nn::AttentionCore, so its tokens cannot be split");

    job.program.wrap(Stage::SyncGradients, [&job, &group](StepContext& context, const StageFn& inner_stage) {
      inner_stage(context);
      if (!context.sync_gradients) zero_missing_gradients(*job.model);
      average_gradients(job.local_gradients(), group);
    });
    job.program.wrap(Stage::Evaluate, [&job, &group](StepContext& context, const StageFn& inner_stage) {
      inner_stage(context);
      at::Tensor loss = at::tensor(context.val_loss, at::kDouble).to(job.device());
      group.all_reduce(loss, ReduceOp::Avg)->wait();
      context.val_loss = read_on_host({loss})[0];  // counted, as every read
    });
    auto last = std::make_shared<std::pair<int64_t, int64_t>>(dist::traffic().all_to_all, attention->ring_bytes());
    job.add_hook(HookPoint::AfterStep, [last, attention](StepContext& context) {
      const int64_t all_to_all = dist::traffic().all_to_all, ring = attention->ring_bytes();
      context.metrics.emplace_back("cp_all_to_all_bytes", static_cast<double>(all_to_all - last->first));
      context.metrics.emplace_back("cp_ring_bytes", static_cast<double>(ring - last->second));
      *last = {all_to_all, ring};
    });
  }

 private:
  // A backward left unsynchronised (WSAM's local pass) has no data-parallel pass fill in the
  // gradients it did not reach (an expert no token of this rank chose): zeros, so that every
  // context rank averages the same list.
  static void zero_missing_gradients(nn::Model& model) {
    for (auto& p : model.parameters())
      if (p.requires_grad() && !p.grad().defined() && !nn::is_placeholder(p)) p.mutable_grad() = at::zeros_like(p);
  }

  // One all-reduce per dtype of every gradient this rank holds, flattened: context ranks hold the
  // same placements, so piece k here and piece k there are the same piece.
  static void average_gradients(const std::vector<LocalGradient>& grads, Communicator& group) {
    std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
    for (const auto& g : grads)
      if (g.grad.defined()) by_dtype[g.grad.scalar_type()].push_back(g.grad);
    for (auto& [dtype, tensors] : by_dtype) {
      std::vector<at::Tensor> flat;
      for (const auto& t : tensors) flat.push_back(t.reshape(-1));
      at::Tensor buffer = at::cat(flat);
      group.all_reduce(buffer, ReduceOp::Avg)->wait();
      int64_t offset = 0;
      for (auto& t : tensors) {
        t.copy_(buffer.narrow(0, offset, t.numel()).view_as(t));
        offset += t.numel();
      }
    }
  }
};

void register_components(Registry& registry) { registry.add(std::make_unique<ContextParallelPass>()); }

}  // namespace
}  // namespace strata::context_parallel

STRATA_PLUGIN("context_parallel", "0.1.0", strata::context_parallel::register_components)
