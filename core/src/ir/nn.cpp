#include "strata/nn.h"

#include "device_loss_scale.h"

#include "strata/core/expert_split.h"
#include "strata/core/process_memory.h"
#include "initial_draws.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/modules/linear.h>

#include "strata/errors.h"
#include "strata/ops.h"
#include "strata/rng.h"

namespace strata::nn {

namespace {
constexpr double kInitStd = 0.02;  // GPT-2's initialisation; model factories rescale where needed
}

namespace {

// This rank's piece of `whole` along `dim`, in `fused` sections each split on its own (into equal
// parts: a fused layer's sections are heads), or split by shard_range when `fused` is 1.
at::Tensor piece_of(const at::Tensor& whole, int64_t dim, TensorShard shard, int64_t fused) {
  if (shard.parts == 1) return whole;
  const int64_t section = whole.size(dim) / fused;
  if (whole.size(dim) % fused != 0 || (fused > 1 && section % shard.parts != 0) || section < shard.parts)
    throw UserError("a layer of size " + std::to_string(whole.size(dim)) + " along dimension " + std::to_string(dim) + " (" +
                    std::to_string(fused) + " section(s)) does not split into " + std::to_string(shard.parts) + " parts");
  const ShardRange range = shard_range(section, shard);
  std::vector<at::Tensor> pieces;
  for (int64_t s = 0; s < fused; ++s) pieces.push_back(whole.narrow(dim, s * section + range.start, range.size));
  return at::cat(pieces, dim).contiguous();
}

void check_shard(TensorShard shard) {
  if (shard.parts < 1 || shard.index < 0 || shard.index >= shard.parts)
    throw std::invalid_argument("tensor shard " + std::to_string(shard.index) + " of " + std::to_string(shard.parts));
}

at::Tensor through(const std::function<at::Tensor(const at::Tensor&)>& hook, const at::Tensor& x) { return hook ? hook(x) : x; }

thread_local WeightGradientQueue* current_queue = nullptr;

// y = x W^T + b as one autograd node whose backward computes the input and bias gradients and
// either computes the weight gradient too or, with a WeightGradientQueue installed, queues it.
// Under autocast the inputs are cast as at::linear's autocast rule does, before they are saved,
// so both gradients see the compute dtype.
class LinearSplitWeightGradient : public torch::autograd::Function<LinearSplitWeightGradient> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias) {
    at::Tensor xc = x, wc = weight, bc = bias;
    const c10::DeviceType device = x.device().type();
    if (at::autocast::is_autocast_enabled(device)) {
      const at::ScalarType dtype = at::autocast::get_autocast_dtype(device);
      xc = x.to(dtype), wc = weight.to(dtype);
      if (bc.numel() > 0) bc = bc.to(dtype);
    }
    ctx->save_for_backward({xc, wc});
    ctx->saved_data["weight"] = weight;  // the parameter itself, whose .grad a queued task adds to
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["has_bias"] = bias.numel() > 0;
    return at::linear(xc, wc, bc.numel() > 0 ? std::optional<at::Tensor>(bc) : std::nullopt);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor xc = saved[0], wc = saved[1], weight = ctx->saved_data["weight"].toTensor();
    const at::Tensor dy = grads[0].to(wc.scalar_type());
    const at::Tensor dx = dy.matmul(wc).to(static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt()));
    at::Tensor db;
    if (ctx->saved_data["has_bias"].toBool()) db = dy.reshape({-1, dy.size(-1)}).sum(0);
    auto weight_gradient = [xc, dy, dtype = weight.scalar_type()] {
      return dy.reshape({-1, dy.size(-1)}).t().mm(xc.reshape({-1, xc.size(-1)})).to(dtype);
    };
    at::Tensor dw;
    if (WeightGradientQueue* queue = WeightGradientQueue::current())
      queue->push([weight, weight_gradient] {
        at::NoGradGuard no_grad;
        at::Tensor g = weight_gradient();
        at::Tensor target = weight;  // a handle on the parameter: its .grad is the parameter's
        if (target.grad().defined())
          target.mutable_grad().add_(g);
        else
          target.mutable_grad() = g;
      });
    else
      dw = weight_gradient();
    return {dx, dw, db};
  }
};

}  // namespace

WeightGradientQueue::Scope::Scope(WeightGradientQueue* queue) : previous_(current_queue) { current_queue = queue; }
WeightGradientQueue::Scope::~Scope() { current_queue = previous_; }
WeightGradientQueue* WeightGradientQueue::current() { return current_queue; }

void WeightGradientQueue::run_all() {
  std::vector<std::function<void()>> tasks = std::move(tasks_);
  tasks_.clear();
  for (auto& task : tasks) task();
}

namespace {
std::atomic<double> loss_gradient_scale{1.0};
// device_loss_scale.h's; set between steps, read during backward. Never destroyed: a CUDA tensor
// must not be freed by a static destructor after the CUDA runtime may have gone.
at::Tensor& device_loss_scale = *new at::Tensor();

// Identity on `output`; backward also sends LossGradientScale::current() into `loss`.
class AuxiliaryLoss : public torch::autograd::Function<AuxiliaryLoss> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& output, const at::Tensor&) { return output; }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*, torch::autograd::variable_list grads) {
    at::Tensor weight = at::scalar_tensor(LossGradientScale::current(), grads[0].options().dtype(at::kFloat));
    if (device_loss_scale.defined()) weight = weight * device_loss_scale.to(weight.device(), at::kFloat);
    return {grads[0], weight};
  }
};
}  // namespace

at::Tensor add_auxiliary_loss(const at::Tensor& output, const at::Tensor& loss) {
  if (loss.numel() != 1) throw std::invalid_argument("add_auxiliary_loss: the loss must be a scalar, not " + c10::str(loss.sizes()));
  if (!at::GradMode::is_enabled() || !loss.requires_grad()) return output;
  return AuxiliaryLoss::apply(output, loss.reshape({}).to(at::kFloat));
}

void set_device_loss_scale(const at::Tensor& scale) { device_loss_scale = scale; }
void forget_device_loss_scale(const at::Tensor& scale) {
  if (device_loss_scale.defined() && device_loss_scale.is_same(scale)) device_loss_scale = at::Tensor();
}

LossGradientScale::LossGradientScale(double scale) : previous_(loss_gradient_scale.exchange(scale)) {}
LossGradientScale::~LossGradientScale() { loss_gradient_scale = previous_; }
double LossGradientScale::current() { return loss_gradient_scale.load(); }

namespace {
thread_local bool skip_initial_draws = false;  // SkipInitialDraws's
}  // namespace

SkipInitialDraws::SkipInitialDraws() : outer_(skip_initial_draws) { skip_initial_draws = true; }
SkipInitialDraws::~SkipInitialDraws() { skip_initial_draws = outer_; }
bool initial_draws_skipped() { return skip_initial_draws; }

namespace {
// A layer's initial weight: normal(0, std) over the whole tensor, or left as allocated under
// SkipInitialDraws.
at::Tensor initial_weight(at::IntArrayRef sizes, double std) {
  at::Tensor weight = at::empty(sizes);
  return skip_initial_draws ? weight : weight.normal_(0.0, std);
}

thread_local TensorShard experts_at_build;  // ExpertSplitAtBuild's, {1, 0} outside one

// Rank `shard.index`'s experts of `groups` split in `shard.parts` equal parts.
ShardRange expert_range(int64_t groups, TensorShard shard) {
  check_shard(shard);
  if (groups % shard.parts != 0)
    throw UserError(std::to_string(groups) + " experts do not split evenly over " + std::to_string(shard.parts) + " expert-parallel ranks");
  return {shard.index * (groups / shard.parts), groups / shard.parts};
}
}  // namespace

ExpertSplitAtBuild::ExpertSplitAtBuild(TensorShard experts) : outer_(experts_at_build) {
  check_shard(experts);
  experts_at_build = experts;
}
ExpertSplitAtBuild::~ExpertSplitAtBuild() { experts_at_build = outer_; }

GroupedLinear::GroupedLinear(int64_t groups_, int64_t in, int64_t out, double init_std, ParallelStyle style, TensorShard shard_)
    : groups(groups_), in_features(in), out_features(out), parallel_style(style),
      shard(style == ParallelStyle::Column || style == ParallelStyle::Row ? shard_ : TensorShard{}) {
  check_shard(shard);
  // The whole tensor is drawn (every layout holds the unsplit model's values), this rank's experts
  // (ExpertSplitAtBuild) and its piece of each kept.
  at::Tensor whole = initial_weight({groups, out, in}, init_std);
  if (experts_at_build.parts > 1) {
    const ShardRange mine = expert_range(groups, experts_at_build);
    whole = whole.narrow(0, mine.start, mine.size).clone();
    expert_shard = experts_at_build;
  }
  weight = register_parameter("weight", piece_of(whole, parallel_style == ParallelStyle::Row ? 2 : 1, shard, 1));
}

at::Tensor GroupedLinear::forward(const at::Tensor& x, at::IntArrayRef group_sizes) {
  return through(hooks.on_output, ops::grouped_mm(through(hooks.on_input, x), weight, group_sizes));
}

void GroupedLinear::keep_groups(TensorShard shard) {
  const ShardRange mine = expert_range(groups, shard);
  if (expert_shard.parts == shard.parts && expert_shard.index == shard.index) return;  // kept at build (ExpertSplitAtBuild)
  if (expert_shard.parts > 1) throw std::logic_error("GroupedLinear: experts split twice");
  at::NoGradGuard no_grad;
  weight.set_data(weight.narrow(0, mine.start, mine.size).clone());
  expert_shard = shard;
}

ExpertParallelLayer::~ExpertParallelLayer() = default;
SequenceStatisticsLayer::~SequenceStatisticsLayer() = default;
SequenceParallelLayer::~SequenceParallelLayer() = default;
SumsRowSplitOutputs::~SumsRowSplitOutputs() = default;

namespace {
class AllToAllRows : public torch::autograd::Function<AllToAllRows> {
 public:
  static at::Tensor exchange(Communicator& group, const at::Tensor& x, const std::vector<int64_t>& send_rows,
                             const std::vector<int64_t>& recv_rows) {
    const at::Tensor input = x.contiguous();
    std::vector<int64_t> shape = input.sizes().vec();
    int64_t row = 1;  // elements per row, from the shape (a rank may send no rows)
    for (size_t d = 1; d < shape.size(); ++d) row *= shape[d];
    shape[0] = 0;
    for (int64_t n : recv_rows) shape[0] += n;
    at::Tensor output = at::empty(shape, input.options());
    std::vector<int64_t> send_elements, recv_elements;
    for (int64_t n : send_rows) send_elements.push_back(n * row);
    for (int64_t n : recv_rows) recv_elements.push_back(n * row);
    group.all_to_all(output, input, recv_elements, send_elements)->wait();
    return output;
  }
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, Communicator* group,
                            std::vector<int64_t> send_rows, std::vector<int64_t> recv_rows) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    ctx->saved_data["send"] = send_rows;
    ctx->saved_data["recv"] = recv_rows;
    return exchange(*group, x, send_rows, recv_rows);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    auto* group = reinterpret_cast<Communicator*>(ctx->saved_data["group"].toInt());
    // The way back: what came from rank r returns to it.
    return {exchange(*group, grads[0], ctx->saved_data["recv"].toIntVector(), ctx->saved_data["send"].toIntVector()), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

class ScaleGradient : public torch::autograd::Function<ScaleGradient> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, double factor) {
    ctx->saved_data["factor"] = factor;
    return x;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    return {grads[0] * ctx->saved_data["factor"].toDouble(), at::Tensor()};
  }
};
}  // namespace

at::Tensor all_to_all_rows(Communicator& group, const at::Tensor& x, const std::vector<int64_t>& send_rows,
                           const std::vector<int64_t>& recv_rows) {
  if (static_cast<int>(send_rows.size()) != group.size() || static_cast<int>(recv_rows.size()) != group.size())
    throw std::invalid_argument("all_to_all_rows: one send and one receive count per rank of the group");
  if (!at::GradMode::is_enabled() || !x.requires_grad()) return AllToAllRows::exchange(group, x, send_rows, recv_rows);
  return AllToAllRows::apply(x, &group, send_rows, recv_rows);
}

at::Tensor scale_gradient(const at::Tensor& x, double factor) {
  if (!at::GradMode::is_enabled() || !x.requires_grad()) return x;
  return ScaleGradient::apply(x, factor);
}

ShardRange shard_range(int64_t size, TensorShard shard) {
  const int64_t base = size / shard.parts, extra = size % shard.parts;
  return {shard.index * base + std::min(shard.index, extra), base + (shard.index < extra ? 1 : 0)};
}

Linear::Linear(int64_t in, int64_t out, bool with_bias, ParallelStyle style, TensorShard shard_, double init_std, int64_t fused)
    : in_features(in), out_features(out), parallel_style(style),
      shard(style == ParallelStyle::Column || style == ParallelStyle::Row ? shard_ : TensorShard{}), fused_sections(fused) {
  check_shard(shard);
  const int64_t dim = parallel_style == ParallelStyle::Row ? 1 : 0;
  // The whole weight is drawn and dropped here: the one whole parameter held beyond the pieces.
  weight = register_parameter("weight", piece_of(initial_weight({out, in}, init_std), dim, shard, dim == 0 ? fused : 1));
  if (with_bias) bias = register_parameter("bias", dim == 0 ? piece_of(at::zeros({out}), 0, shard, fused) : at::zeros({out}));
}

at::Tensor Linear::forward(const at::Tensor& x) {
  // A row-split layer's outputs are partial sums: its bias goes in after on_output sums them.
  const bool bias_after = bias.defined() && parallel_style == ParallelStyle::Row && shard.parts > 1;
  const at::Tensor b = bias.defined() ? through(hooks.on_bias, bias) : bias;
  if (split_weight_gradient && !hooks.on_weight && !hooks.compute && at::GradMode::is_enabled()) {
    // No bias is an empty tensor: autograd functions take defined tensors only.
    const at::Tensor no_bias = at::empty({0}, weight.options().requires_grad(false));
    at::Tensor y = through(hooks.on_output, LinearSplitWeightGradient::apply(through(hooks.on_input, x), weight,
                                                                             bias_after || !b.defined() ? no_bias : b));
    return bias_after ? y + b : y;
  }
  const std::optional<at::Tensor> inner_bias = b.defined() && !bias_after ? std::optional<at::Tensor>(b) : std::nullopt;
  at::Tensor y = hooks.compute ? hooks.compute(through(hooks.on_input, x), through(hooks.on_weight, weight), inner_bias)
                               : ops::linear(through(hooks.on_input, x), through(hooks.on_weight, weight), inner_bias);
  y = through(hooks.on_output, y);
  return bias_after ? y + b : y;
}

Embedding::Embedding(int64_t count_, int64_t dim, ParallelStyle style, TensorShard shard_)
    : count(count_), parallel_style(style), shard(style == ParallelStyle::Column ? shard_ : TensorShard{}) {
  check_shard(shard);
  first_row = shard_range(count, shard).start;
  weight = register_parameter("weight", piece_of(initial_weight({count, dim}, kInitStd), 0, shard, 1));
}

at::Tensor Embedding::forward(const at::Tensor& ids_in) {
  const at::Tensor ids = through(hooks.on_input, ids_in);
  if (shard.parts == 1) return through(hooks.on_output, at::embedding(weight, ids));
  const int64_t rows = weight.size(0);
  const at::Tensor local = ids - first_row;
  const at::Tensor outside = local.lt(0).logical_or_(local.ge(rows));
  at::Tensor out = at::embedding(weight, local.masked_fill(outside, 0)).masked_fill(outside.unsqueeze(-1), 0.0);
  return through(hooks.on_output, out);
}

at::Tensor TiedLinear::forward(const at::Tensor& x) {
  const at::Tensor input = through(hooks.on_input, x);
  return through(hooks.on_output, hooks.compute ? hooks.compute(input, embedding_->weight, std::nullopt)
                                                : ops::linear(input, embedding_->weight, std::nullopt));
}

LayerNorm::LayerNorm(int64_t dim, bool with_bias, double eps_, ParallelStyle style) : eps(eps_), parallel_style(style) {
  weight = register_parameter("weight", at::ones({dim}));
  if (with_bias) bias = register_parameter("bias", at::zeros({dim}));
}

at::Tensor LayerNorm::forward(const at::Tensor& x) {
  return through(hooks.on_output, ops::layer_norm(through(hooks.on_input, x), through(hooks.on_weight, weight),
                                                  bias.defined() ? std::optional<at::Tensor>(through(hooks.on_bias, bias)) : std::nullopt,
                                                  eps));
}

ops::AddNormResult LayerNorm::forward_residual(const at::Tensor& residual, const at::Tensor& x) {
  if (hooks.on_input) {  // the hook sees the sum, so the add cannot move into the norm
    at::Tensor sum = residual + x;
    return {sum, forward(sum)};
  }
  ops::AddNormResult r = ops::add_layer_norm(
      residual, x, through(hooks.on_weight, weight),
      bias.defined() ? std::optional<at::Tensor>(through(hooks.on_bias, bias)) : std::nullopt, eps);
  r.normed = through(hooks.on_output, r.normed);
  return r;
}

RmsNorm::RmsNorm(int64_t dim, double eps_, ParallelStyle style) : eps(eps_), parallel_style(style) {
  weight = register_parameter("weight", at::ones({dim}));
}

at::Tensor RmsNorm::forward(const at::Tensor& x) {
  return through(hooks.on_output, ops::rms_norm(through(hooks.on_input, x), through(hooks.on_weight, weight), eps));
}

ops::AddNormResult RmsNorm::forward_residual(const at::Tensor& residual, const at::Tensor& x) {
  if (hooks.on_input) {
    at::Tensor sum = residual + x;
    return {sum, forward(sum)};
  }
  ops::AddNormResult r = ops::add_rms_norm(residual, x, through(hooks.on_weight, weight), eps);
  r.normed = through(hooks.on_output, r.normed);
  return r;
}

at::Tensor Dropout::forward(const at::Tensor& x) {
  const SequenceLayout& sequence = current_sequence();
  const bool context_split = sequence.token_index.defined() && sequence.window > sequence.token_index.size(0);
  if ((sequence_shard.parts == 1 && !context_split) || !is_training() || p == 0.0 || p == 1.0) return at::dropout(x, p, is_training());
  // at::dropout's CPU recipe (a Bernoulli(1 - p) mask of the input's shape, divided by 1 - p, times
  // the input) for the whole sequence, of which this rank keeps its tokens (dimension -2): the
  // context rank's window positions, then the sequence-parallel rank's contiguous part of them.
  std::vector<int64_t> whole = x.sizes().vec();
  const int64_t local = whole.at(whole.size() - 2);
  whole[whole.size() - 2] = context_split ? sequence.window : local * sequence_shard.parts;
  at::Tensor noise = at::empty(whole, x.options()).bernoulli_(1.0 - p);
  if (context_split) noise = noise.index_select(-2, sequence.token_index.to(x.device()));
  if (sequence_shard.parts > 1) noise = noise.narrow(-2, sequence_shard.index * local, local);
  return x * noise.div_(1.0 - p);
}

namespace {
thread_local SequenceLayout current_layout;
}

at::Tensor SequenceLayout::position_ids(int64_t t, const at::Device& device) const {
  if (positions.defined()) return positions.to(device);
  return index(t, device);
}

at::Tensor SequenceLayout::index(int64_t t, const at::Device& device) const {
  if (token_index.defined()) return token_index.to(device);
  return at::arange(t, at::TensorOptions().dtype(at::kLong).device(device));
}

at::Tensor SequenceLayout::local_documents() const {
  if (!documents.defined() || !token_index.defined()) return documents;
  return documents.index_select(1, token_index.to(documents.device()));
}

SequenceLayout packed_sequence(const at::Tensor& inputs, int64_t document_end, bool reset_positions) {
  SequenceLayout out;
  out.window = inputs.size(1);
  if (document_end < 0) return out;
  const at::Tensor ends = inputs.eq(document_end).to(at::kLong);
  out.documents = ends.cumsum(1) - ends;
  if (reset_positions) {
    // A document starts at 0 and after each end token; a token's position is its distance from
    // the latest start at or before it.
    const at::Tensor index = at::arange(out.window, inputs.options().dtype(at::kLong)).expand_as(inputs);
    at::Tensor starts = at::zeros_like(ends);
    starts.narrow(1, 1, out.window - 1).copy_(ends.narrow(1, 0, out.window - 1));
    starts.select(1, 0).fill_(1);
    out.positions = index - std::get<0>(at::cummax(index * starts, 1));
  }
  return out;
}

SequenceScope::SequenceScope(SequenceLayout layout) : previous_(std::move(current_layout)) { current_layout = std::move(layout); }
SequenceScope::~SequenceScope() { current_layout = std::move(previous_); }
const SequenceLayout& current_sequence() { return current_layout; }

at::Tensor AttentionCore::forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const SequenceLayout& sequence = current_sequence();
  ops::AttentionMask mask;
  mask.causal = causal;
  mask.sliding_window = sliding_window;
  if (sequence.token_index.defined()) mask.q_index = mask.kv_index = sequence.token_index.to(q.device());
  if (sequence.documents.defined()) mask.q_document = mask.kv_document = sequence.local_documents().to(q.device());
  if (attend) return attend(q, k, v, mask);
  return ops::attention(q, k, v, mask).out;
}

Block::~Block() = default;

AbsentBlock::AbsentBlock(std::string type, std::vector<ParameterShape> parameters, bool reads_tied_weight)
    : Block(std::move(type)), parameters_(std::move(parameters)), reads_tied_weight_(reads_tied_weight) {}
namespace {
Placements module_placements(const torch::nn::Module& root);

// The placements an AbsentBlock's parameters had when the factory built them (parameter_placements
// of an absent block), kept beside the blocks: AbsentBlock's layout is part of the plugin ABI.
std::mutex absent_placements_mutex;
std::map<const AbsentBlock*, Placements> absent_placements;
}  // namespace

AbsentBlock::~AbsentBlock() {
  const std::lock_guard<std::mutex> lock(absent_placements_mutex);
  absent_placements.erase(this);
}
int64_t AbsentBlock::parameter_count() const {
  int64_t count = 0;
  for (const auto& p : parameters_) count += c10::multiply_integers(p.shape);
  return count;
}
at::Tensor AbsentBlock::forward(const at::Tensor&) {
  throw std::logic_error("a block this rank did not build (nn::AbsentBlock) was run");
}

namespace {
thread_local const std::function<bool(size_t)>* current_block_filter = nullptr;
// The live KeepAtBuild scopes' keepers, outermost first.
thread_local std::vector<BuildKeeper*> keepers;

bool holds_tied_linear(const Block& block) {
  for (const auto& m : block.modules(/*include_self=*/false))
    if (dynamic_cast<const TiedLinear*>(m.get())) return true;
  return false;
}
}  // namespace

BlockFilter::BlockFilter(std::function<bool(size_t index)> keep) : outer_(current_block_filter), keep_(std::move(keep)) {
  current_block_filter = &keep_;
}
BlockFilter::~BlockFilter() { current_block_filter = outer_; }

BuildKeeper::~BuildKeeper() = default;

at::Tensor placeholder(at::IntArrayRef sizes, const at::TensorOptions& options) {
  // NaN, not zero: a pass that computed with a placeholder's values would be loud, not subtly wrong.
  const bool floating = at::isFloatingType(c10::typeMetaToScalarType(options.dtype()));
  return at::full({1}, floating ? std::numeric_limits<double>::quiet_NaN() : 0.0, options.requires_grad(false)).expand(sizes);
}

bool is_placeholder(const at::Tensor& t) {
  return t.defined() && t.numel() > 1 && t.storage().nbytes() < static_cast<size_t>(t.numel()) * t.element_size();
}
KeepAtBuild::KeepAtBuild(BuildKeeper* keeper) : outer_(keepers.empty() ? nullptr : keepers.back()) { keepers.push_back(keeper); }
KeepAtBuild::~KeepAtBuild() { keepers.pop_back(); }

std::vector<ParameterShape> block_parameter_shapes(const Model& model, size_t index) {
  if (const auto* absent = dynamic_cast<const AbsentBlock*>(&model.block(index))) return absent->parameter_shapes();
  std::vector<ParameterShape> out;
  for (const auto& p : model.block(index).named_parameters()) out.push_back({p.key(), p.value().sizes().vec(), p.value().requires_grad()});
  return out;
}

int64_t block_parameter_count(const Model& model, size_t index) {
  if (const auto* absent = dynamic_cast<const AbsentBlock*>(&model.block(index))) return absent->parameter_count();
  int64_t count = 0;
  for (const auto& p : model.block(index).parameters()) count += p.numel();
  return count;
}

bool block_reads_tied_weight(const Model& model, size_t index) {
  if (const auto* absent = dynamic_cast<const AbsentBlock*>(&model.block(index))) return absent->reads_tied_weight();
  return holds_tied_linear(model.block(index));
}

}  // namespace strata::nn

namespace strata {
struct detail::ModelState {
  struct Entry {
    std::string name;
    std::shared_ptr<nn::Block> block;
    nn::BlockExecutor executor;
    std::vector<nn::BlockHook> pre, post;
  };
  std::vector<Entry> blocks;
  std::vector<std::string> shared;
  int64_t vocab_size, seq_len;
  int64_t layers = 0, heads = 0, head_dim = 0;
  double inactive_parameters = 0;
};
}  // namespace strata

namespace strata::nn {

using Entry = detail::ModelState::Entry;

Model::Model(int64_t vocab_size, int64_t seq_len)
    : state_(std::make_unique<detail::ModelState>(detail::ModelState{{}, {}, vocab_size, seq_len})) {}
size_t Model::num_blocks() const { return state_->blocks.size(); }
Block& Model::block(size_t i) const { return *state_->blocks.at(i).block; }
const std::string& Model::block_name(size_t i) const { return state_->blocks.at(i).name; }
void Model::mark_shared(const std::string& parameter_name) { state_->shared.push_back(parameter_name); }
const std::vector<std::string>& Model::shared_parameters() const { return state_->shared; }
int64_t Model::vocab_size() const { return state_->vocab_size; }
int64_t Model::seq_len() const { return state_->seq_len; }
void Model::set_inactive_parameters(double count) { state_->inactive_parameters = count; }
Model::~Model() = default;

void Model::add_block(const std::string& name, std::shared_ptr<Block> block) {
  if (current_block_filter && !(*current_block_filter)(state_->blocks.size())) {
    std::vector<ParameterShape> parameters;
    for (const auto& p : block->named_parameters()) parameters.push_back({p.key(), p.value().sizes().vec(), p.value().requires_grad()});
    Placements placements = module_placements(*block);
    auto absent = std::make_shared<AbsentBlock>(block->type(), std::move(parameters), holds_tied_linear(*block));
    if (!placements.empty()) {
      const std::lock_guard<std::mutex> lock(absent_placements_mutex);
      absent_placements[absent.get()] = std::move(placements);
    }
    block = std::move(absent);
  } else {
    for (auto keeper = keepers.rbegin(); keeper != keepers.rend(); ++keeper) (*keeper)->built(state_->blocks.size(), name, *block);
    // What the keepers let go, and the whole tensors layers drew to keep a piece of (tensor and
    // expert parallel), before the next block is drawn: glibc kept them otherwise (an expert 4
    // rank's build peaked at the whole model's size).
    release_free_memory();
  }
  register_module(name, block);
  state_->blocks.push_back(Entry{name, std::move(block), nullptr, {}, {}});
}

void Model::keep_blocks(const std::vector<size_t>& indices) {
  std::vector<Entry> kept;
  for (size_t i = 0; i < state_->blocks.size(); ++i) {
    if (std::find(indices.begin(), indices.end(), i) != indices.end())
      kept.push_back(std::move(state_->blocks[i]));
    else
      unregister_module(state_->blocks[i].name);
  }
  state_->blocks = std::move(kept);
}

std::vector<size_t> Model::find_blocks(const std::vector<std::string>& selectors) const {
  std::vector<size_t> out;
  for (size_t i = 0; i < state_->blocks.size(); ++i)
    for (const auto& s : selectors)
      if (s == state_->blocks[i].name || s == state_->blocks[i].block->type()) {
        out.push_back(i);
        break;
      }
  return out;
}

void Model::set_executor(size_t i, BlockExecutor executor) { state_->blocks.at(i).executor = std::move(executor); }
void Model::add_pre_forward_hook(size_t i, BlockHook hook) { state_->blocks.at(i).pre.push_back(std::move(hook)); }
void Model::add_post_forward_hook(size_t i, BlockHook hook) { state_->blocks.at(i).post.push_back(std::move(hook)); }

namespace {

thread_local const MicroBatchRandomness* current_randomness = nullptr;
thread_local bool randomness_unkeyed = false;  // an UnkeyedRandomness is alive

// splitmix64's finaliser: every input bit moves every output bit.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Seeds the generators for one block's draws and puts them back when the block is done, also
// when it throws.
class BlockRandomness {
 public:
  BlockRandomness(const c10::Device& device, uint64_t seed) : outside_(device) { seed_generators(device, seed); }
  ~BlockRandomness() { outside_.restore(); }
  BlockRandomness(const BlockRandomness&) = delete;
  BlockRandomness& operator=(const BlockRandomness&) = delete;

 private:
  RngSnapshot outside_;
};

}  // namespace

MicroBatchRandomness::MicroBatchRandomness(uint64_t seed, int64_t step, int64_t micro, int64_t data_rank)
    : key_(mix(mix(mix(mix(seed) ^ static_cast<uint64_t>(step)) ^ static_cast<uint64_t>(micro)) ^ static_cast<uint64_t>(data_rank))),
      outer_(current_randomness) {
  current_randomness = this;
}

MicroBatchRandomness::~MicroBatchRandomness() { current_randomness = outer_; }

const MicroBatchRandomness* MicroBatchRandomness::current() { return current_randomness; }

UnkeyedRandomness::UnkeyedRandomness() : outer_(std::exchange(randomness_unkeyed, true)) {}
UnkeyedRandomness::~UnkeyedRandomness() { randomness_unkeyed = outer_; }

uint64_t MicroBatchRandomness::block_seed(const std::string& name) const {
  uint64_t h = 0xCBF29CE484222325ULL;  // FNV-1a over the name
  for (const unsigned char c : name) h = (h ^ c) * 0x100000001B3ULL;
  return mix(key_ ^ h);
}

at::Tensor Model::forward(const at::Tensor& tokens) { return forward_blocks(0, state_->blocks.size(), tokens); }

at::Tensor Model::forward_blocks(size_t first, size_t last, const at::Tensor& input) {
  at::Tensor x = input;
  const MicroBatchRandomness* randomness = is_training() && !randomness_unkeyed ? MicroBatchRandomness::current() : nullptr;
  for (size_t i = first; i < last; ++i) {
    Entry& entry = state_->blocks.at(i);
    // Operators called in the block (its hooks included) see which block runs: pins per block.
    const ops::BlockScope scope(entry.name, entry.block->type());
    std::optional<BlockRandomness> draws;
    if (randomness) draws.emplace(x.device(), randomness->block_seed(entry.name));
    for (auto& hook : entry.pre) hook(*entry.block, x);
    x = entry.executor ? entry.executor(*entry.block, x) : entry.block->forward(x);
    for (auto& hook : entry.post) hook(*entry.block, x);
  }
  return x;
}

namespace {

// Where piece_of puts this rank's piece of a tensor `whole_size` long along `dim`: a block along
// `dim`, in `fused` sections along dim 0.
Placement piece_placement(const at::Tensor& piece, int64_t dim, int64_t whole_size, TensorShard shard, int64_t fused) {
  Placement p;
  p.shape = piece.sizes().vec();
  p.shape[dim] = whole_size;
  p.block_start.assign(p.shape.size(), 0);
  p.block_size = piece.sizes().vec();
  p.block_start[dim] = shard_range(whole_size / fused, shard).start;
  p.sections = dim == 0 ? fused : 1;
  p.sharded_over = {Dim::Tensor};
  return p;
}

}  // namespace

namespace {
Placements module_placements(const torch::nn::Module& root) {
  Placements out;
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    const std::string prefix = item.key() + ".";
    if (const auto* linear = dynamic_cast<const Linear*>(item.value().get()); linear && linear->shard.parts > 1) {
      const bool row = linear->parallel_style == ParallelStyle::Row;
      const int64_t fused = row ? 1 : linear->fused_sections;
      out.emplace(prefix + "weight", piece_placement(linear->weight, row ? 1 : 0, row ? linear->in_features : linear->out_features,
                                                     linear->shard, fused));
      if (linear->bias.defined() && !row)
        out.emplace(prefix + "bias", piece_placement(linear->bias, 0, linear->out_features, linear->shard, fused));
    } else if (const auto* embedding = dynamic_cast<const Embedding*>(item.value().get()); embedding && embedding->shard.parts > 1) {
      out.emplace(prefix + "weight", piece_placement(embedding->weight, 0, embedding->count, embedding->shard, 1));
    } else if (const auto* experts = dynamic_cast<const GroupedLinear*>(item.value().get());
               experts && (experts->expert_shard.parts > 1 || experts->shard.parts > 1)) {
      // A block: this rank's experts along dim 0 (over Dim::Expert), its piece of each along dim
      // 1 (Column) or 2 (Row) (over Dim::Tensor).
      Placement p;
      p.shape = {experts->groups, experts->out_features, experts->in_features};
      p.block_start = {0, 0, 0};
      p.block_size = experts->weight.sizes().vec();
      if (experts->expert_shard.parts > 1) {
        p.block_start[0] = experts->expert_shard.index * (experts->groups / experts->expert_shard.parts);
        p.sharded_over.push_back(Dim::Expert);
      }
      if (experts->shard.parts > 1) {
        const int64_t dim = experts->parallel_style == ParallelStyle::Row ? 2 : 1;
        p.block_start[static_cast<size_t>(dim)] = shard_range(p.shape[static_cast<size_t>(dim)], experts->shard).start;
        p.sharded_over.push_back(Dim::Tensor);
      }
      out.emplace(prefix + "weight", p);
    }
  }
  return out;
}
}  // namespace

Placements parameter_placements(const Model& model) { return module_placements(model); }
Placements parameter_placements(const Block& block) {
  if (const auto* absent = dynamic_cast<const AbsentBlock*>(&block)) {
    const std::lock_guard<std::mutex> lock(absent_placements_mutex);
    const auto found = absent_placements.find(absent);
    return found == absent_placements.end() ? Placements{} : found->second;
  }
  return module_placements(block);
}

std::vector<std::string> Model::decayed_parameter_names() const {
  std::vector<std::string> out;
  std::set<const void*> seen;
  for (const auto& item : named_modules("", /*include_self=*/false)) {
    const auto* module = item.value().get();
    for (const auto& p : module->named_parameters(/*recurse=*/false)) {
      if (!seen.insert(p.value().unsafeGetTensorImpl()).second) continue;
      // libtorch's own Linear too: a program's plain module (strata/accelerate.h) is made of them.
      if ((dynamic_cast<const Linear*>(module) || dynamic_cast<const GroupedLinear*>(module) ||
           dynamic_cast<const torch::nn::LinearImpl*>(module)) &&
          p.key() == "weight")
        out.push_back(item.key() + "." + p.key());
    }
  }
  return out;
}

void Model::set_attention_shape(int64_t layers, int64_t heads, int64_t head_dim) {
  state_->layers = layers;
  state_->heads = heads;
  state_->head_dim = head_dim;
}

double Model::training_flops_per_token() const {
  double n = -state_->inactive_parameters;
  for (const auto& p : parameters()) n += static_cast<double>(p.numel());
  return 6.0 * n + 12.0 * static_cast<double>(state_->layers * state_->heads * state_->head_dim * state_->seq_len);
}

ReportsMetrics::~ReportsMetrics() = default;
ReportsDeviceMetrics::~ReportsDeviceMetrics() = default;
AdjustsAfterStep::~AdjustsAfterStep() = default;

void Model::after_optimizer_step(Communicator& token_ranks) {
  for (const auto& module : modules(/*include_self=*/false))
    if (auto* adjusts = dynamic_cast<AdjustsAfterStep*>(module.get())) adjusts->after_optimizer_step(token_ranks);
}

void Model::collect_metrics(std::vector<std::pair<std::string, double>>& out) const {
  std::vector<std::pair<std::string, double>> figures;
  for (const auto& module : modules(/*include_self=*/false))
    if (auto* reporter = dynamic_cast<ReportsMetrics*>(module.get())) reporter->report_metrics(figures);
  const size_t first = out.size();
  for (const auto& [name, value] : figures) {
    auto same = std::find_if(out.begin() + static_cast<std::ptrdiff_t>(first), out.end(), [&](const auto& f) { return f.first == name; });
    if (same == out.end())
      out.emplace_back(name, value);
    else
      same->second += value;
  }
}

}  // namespace strata::nn
