#include "context_attention.h"

#include <limits>
#include <optional>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "strata/dist.h"
#include "strata/errors.h"
#include "strata/nn.h"

namespace strata::context_parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int kBlockTag = 7100, kGradientTag = 7101;

// A key/value block on its way from this rank to the next of the ring while the previous rank's
// arrives.
struct Rotation {
  at::Tensor sent, received;
  WorkPtr work;
};

Rotation start_rotation(const at::Tensor& block, Communicator& ring, std::atomic<int64_t>& bytes) {
  const int n = ring.size(), next = (ring.rank() + 1) % n, previous = (ring.rank() + n - 1) % n;
  Rotation r{block.detach().contiguous(), {}, {}};
  r.received = at::empty_like(r.sent);
  r.work = ring.batch_p2p({{P2POp::Kind::Send, r.sent, next, kBlockTag}, {P2POp::Kind::Recv, r.received, previous, kBlockTag}});
  bytes += static_cast<int64_t>(r.sent.nbytes());
  return r;
}

// The block received in a rotation, as a function of the block sent: its gradient is the
// gradient of the received block, sent back to where it came from (ring_keeping_blocks).
struct ReceivedBlock : torch::autograd::Function<ReceivedBlock> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& sent, int64_t rotation, int64_t ring, int64_t bytes) {
    ctx->saved_data["ring"] = ring;
    ctx->saved_data["bytes"] = bytes;
    auto* r = reinterpret_cast<Rotation*>(rotation);
    r->work->wait();
    return r->received;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto& ring = *reinterpret_cast<Communicator*>(ctx->saved_data["ring"].toInt());
    auto& bytes = *reinterpret_cast<std::atomic<int64_t>*>(ctx->saved_data["bytes"].toInt());
    const int n = ring.size(), next = (ring.rank() + 1) % n, previous = (ring.rank() + n - 1) % n;
    const at::Tensor gradient = grads[0].contiguous();
    at::Tensor returned = at::empty_like(gradient);
    ring.batch_p2p({{P2POp::Kind::Send, gradient, previous, kGradientTag}, {P2POp::Kind::Recv, returned, next, kGradientTag}})->wait();
    bytes += static_cast<int64_t>(gradient.nbytes());
    return {returned, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Sends this rank's accumulated gradient of a block on to the next ring rank while the previous
// rank's arrives.
Rotation start_gradient_rotation(const at::Tensor& gradient, Communicator& ring, std::atomic<int64_t>& bytes) {
  const int n = ring.size(), next = (ring.rank() + 1) % n, previous = (ring.rank() + n - 1) % n;
  Rotation r{gradient.contiguous(), {}, {}};
  r.received = at::empty_like(r.sent);
  r.work = ring.batch_p2p({{P2POp::Kind::Send, r.sent, next, kGradientTag}, {P2POp::Kind::Recv, r.received, previous, kGradientTag}});
  bytes += static_cast<int64_t>(r.sent.nbytes());
  return r;
}

// Two partial attentions of the same queries over disjoint keys, merged by their log-sum-exp.
// The running output stays in fp32 (a.out) so half precision rounds once, at the end.
ops::AttentionResult merge(const ops::AttentionResult& a, const ops::AttentionResult& b) {
  const at::Tensor lse = at::logaddexp(a.lse, b.lse);
  return {a.out * at::exp(a.lse - lse).unsqueeze(-1) + b.out.to(a.out.scalar_type()) * at::exp(b.lse - lse).unsqueeze(-1), lse};
}

// Adds a partial attention to the running result of its query chunk (none yet: it becomes it).
void merge_into(ops::AttentionResult& merged, const ops::AttentionResult& result) {
  if (merged.out.defined()) merged = merge(merged, result);
  else merged = {result.out.to(at::promote_types(result.out.scalar_type(), at::kFloat)), result.lse};
}

at::Tensor chunk_rows(const at::Tensor& x, int64_t position, int64_t length) { return x.narrow(-2, position * length, length); }

// The rows of several chunks, in order: a view for one, a copy for more.
at::Tensor chunks_rows(const at::Tensor& x, const std::vector<int64_t>& positions, int64_t length) {
  if (positions.size() == 1) return chunk_rows(x, positions[0], length);
  std::vector<at::Tensor> rows;
  for (int64_t p : positions) rows.push_back(chunk_rows(x, p, length));
  return at::cat(rows, 2);
}

}  // namespace

// The ring as one autograd node: q, k, v in, the merged output out; backward in ring_backward.
struct RingFunction : torch::autograd::Function<RingFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const ContextAttention* attention, bool causal, int64_t sliding_window,
                            const std::optional<at::Tensor>& documents) {  // not an input: an undefined tensor is none
    const ContextAttention::RingMask mask{causal, sliding_window, documents.value_or(at::Tensor())};
    const ops::AttentionResult result = attention->ring_forward(q, k, v, mask);
    ctx->saved_data["attention"] = reinterpret_cast<int64_t>(attention);
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["sliding_window"] = sliding_window;
    ctx->saved_data["documents"] = documents;
    // The running block's name and type (the model's strings, which outlive the step), so that
    // backward picks the attention_backward implementation pinned for the block.
    ctx->saved_data["block_name"] = reinterpret_cast<int64_t>(&ops::BlockScope::name());
    ctx->saved_data["block_type"] = reinterpret_cast<int64_t>(&ops::BlockScope::type());
    ctx->save_for_backward({q, k, v, result.out, result.lse});
    return result.out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto* attention = reinterpret_cast<const ContextAttention*>(ctx->saved_data["attention"].toInt());
    const ContextAttention::RingMask mask{ctx->saved_data["causal"].toBool(), ctx->saved_data["sliding_window"].toInt(),
                                          ctx->saved_data["documents"].toOptional<at::Tensor>().value_or(at::Tensor())};
    const ops::BlockScope scope(*reinterpret_cast<const std::string*>(ctx->saved_data["block_name"].toInt()),
                                *reinterpret_cast<const std::string*>(ctx->saved_data["block_type"].toInt()));
    const auto [dq, dk, dv] = attention->ring_backward(saved[0], saved[1], saved[2], saved[3], saved[4], grads[0], mask);
    return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

ContextAttention::ContextAttention(SequenceSplit split, int context_rank, std::shared_ptr<Communicator> inner,
                                   std::shared_ptr<Communicator> outer, bool rotate)
    : split_(split), context_rank_(context_rank), rotate_(rotate), inner_(std::move(inner)), outer_(std::move(outer)),
      ring_bytes_(std::make_shared<std::atomic<int64_t>>(0)) {}

std::vector<int64_t> ContextAttention::group_chunks(int outer_rank) const {
  std::vector<int64_t> out;
  for (int j = 0; j < inner_->size(); ++j)
    for (int64_t chunk : split_.chunks_of(outer_rank * inner_->size() + j)) out.push_back(chunk);
  return out;
}

at::Tensor ContextAttention::attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ops::AttentionMask& local) const {
  if (local.additive)
    throw UserError("context_parallel: an additive attention mask is given per rank and cannot follow the tokens to other ranks");
  const at::Tensor documents = nn::current_sequence().documents;
  const int u = inner_->size();
  at::Tensor query = q, key = k, value = v;
  if (u > 1) {
    if (key.size(1) % u != 0) {  // grouped-query heads that do not divide: one kv head per q head
      key = key.repeat_interleave(q.size(1) / key.size(1), 1);
      value = value.repeat_interleave(q.size(1) / value.size(1), 1);
    }
    query = dist::all_to_all(query, 1, 2, *inner_);
    key = dist::all_to_all(key, 1, 2, *inner_);
    value = dist::all_to_all(value, 1, 2, *inner_);
  }
  at::Tensor out;
  if (outer_->size() == 1) {
    // Ulysses alone: every token of the window is here, in the ranks' chunk order. Put them in
    // window order so that the mask is plain causal and ATen's fused kernel applies, then back.
    const at::Tensor index = split_.token_index(group_chunks(0), q.device());
    const at::Tensor order = index.argsort();
    auto sorted = [&](const at::Tensor& x) { return x.index_select(2, order); };
    ops::AttentionMask mask;
    mask.causal = local.causal;
    mask.sliding_window = local.sliding_window;
    if (documents.defined()) mask.q_document = mask.kv_document = documents.to(q.device());
    const at::Tensor in_window_order = ops::attention(sorted(query), sorted(key), sorted(value), mask).out;
    out = in_window_order.index_select(2, order.argsort());
  } else {
    if (rotate_)
      out = RingFunction::apply(query, key, value, this, local.causal, local.sliding_window,
                                documents.defined() ? std::optional<at::Tensor>(documents) : std::nullopt);
    else
      out = ring_keeping_blocks(query, key, value, {local.causal, local.sliding_window, documents});
  }
  return u > 1 ? dist::all_to_all(out, 2, 1, *inner_) : out;
}

std::vector<ContextAttention::ChunkPair> ContextAttention::step_pairs(int step, const RingMask& m, const at::Device& device) const {
  const int r = outer_->size(), me = outer_->rank();
  const std::vector<int64_t> mine = group_chunks(me), theirs = group_chunks((me - step + r) % r);
  auto index_of = [&](const std::vector<int64_t>& chunks) { return split_.token_index(chunks, device); };
  std::vector<ChunkPair> pairs;
  for (size_t a = 0; a < mine.size(); ++a) {
    ChunkPair pair;
    pair.query = static_cast<int64_t>(a);
    std::vector<int64_t> seen;
    bool diagonal = false;
    for (size_t b = 0; b < theirs.size(); ++b) {
      if (m.causal && theirs[b] > mine[a]) continue;  // entirely in this query chunk's future
      diagonal = diagonal || theirs[b] == mine[a];
      seen.push_back(theirs[b]);
      pair.key_blocks.push_back(static_cast<int64_t>(b));
    }
    if (seen.empty()) continue;
    // Off the diagonal every key precedes every query, unless a sliding window hides the older ones.
    pair.mask.causal = m.causal && (diagonal || m.sliding_window > 0);
    pair.mask.sliding_window = m.sliding_window;
    const at::Tensor q_index = index_of({mine[a]}), kv_index = index_of(seen);
    if (pair.mask.causal) {
      pair.mask.q_index = q_index;
      pair.mask.kv_index = kv_index;
    }
    if (m.documents.defined()) {
      pair.mask.q_document = m.documents.index_select(1, q_index);
      pair.mask.kv_document = m.documents.index_select(1, kv_index);
    }
    pairs.push_back(std::move(pair));
  }
  return pairs;
}

ops::AttentionResult ContextAttention::attend_pair(const at::Tensor& q, const at::Tensor& block, const ChunkPair& pair) const {
  const int64_t length = split_.chunk_length();
  return ops::attention(chunk_rows(q, pair.query, length), chunks_rows(block[0], pair.key_blocks, length),
                        chunks_rows(block[1], pair.key_blocks, length), pair.mask, /*with_lse=*/true);
}

std::vector<ops::AttentionResult> ContextAttention::ring_steps(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                             const RingMask& mask, bool blocks_in_graph) const {
  Communicator& ring = *outer_;
  const int r = ring.size();
  std::vector<ops::AttentionResult> partial(group_chunks(ring.rank()).size());
  at::Tensor block = at::stack({k, v});  // one message per step
  at::Tensor unused;  // blocks this rank's queries never see, kept in the graph (see below)
  for (int step = 0; step < r; ++step) {
    std::unique_ptr<Rotation> rotation;  // a stable address: ReceivedBlock holds it until it waits
    if (step + 1 < r) rotation = std::make_unique<Rotation>(start_rotation(block, ring, *ring_bytes_));
    const std::vector<ChunkPair> pairs = step_pairs(step, mask, q.device());
    for (const ChunkPair& pair : pairs) {
      merge_into(partial[static_cast<size_t>(pair.query)], attend_pair(q, block, pair));
    }
    // Under autograd every rank must run every rotation's backward (its ring partners wait for
    // the message), so a received block no query uses still joins the graph, with a zero
    // gradient. (One element times zero: a sum of a half-precision block could overflow to inf,
    // and inf * 0 is NaN.)
    if (blocks_in_graph && pairs.empty()) {
      const at::Tensor zero = (block.reshape(-1).narrow(0, 0, 1) * 0.0).sum();
      unused = unused.defined() ? unused + zero : zero;
    }
    if (!rotation) continue;
    if (blocks_in_graph) {
      block = ReceivedBlock::apply(block, reinterpret_cast<int64_t>(rotation.get()), reinterpret_cast<int64_t>(&ring),
                                   reinterpret_cast<int64_t>(ring_bytes_.get()));
    } else {
      rotation->work->wait();
      block = rotation->received;
    }
  }
  // The unused blocks' zero joins the first chunk that has a result (every query chunk sees at
  // least its own chunk under autograd's masks: causal or not, the diagonal is visible).
  if (unused.defined()) {
    for (auto& p : partial) {
      if (!p.out.defined()) continue;
      p.out = p.out + unused.to(p.out.scalar_type());
      break;
    }
  }
  return partial;
}

at::Tensor ContextAttention::ring_keeping_blocks(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const RingMask& mask) const {
  std::vector<at::Tensor> outs;
  for (const auto& p : ring_steps(q, k, v, mask, /*blocks_in_graph=*/true)) outs.push_back(p.out);  // every query chunk sees its own chunk
  return at::cat(outs, 2).to(q.scalar_type());
}

ops::AttentionResult ContextAttention::ring_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const RingMask& mask) const {
  const int64_t length = split_.chunk_length();
  std::vector<ops::AttentionResult> partial = ring_steps(q, k, v, mask, /*blocks_in_graph=*/false);
  std::vector<at::Tensor> outs, lses;
  for (size_t a = 0; a < partial.size(); ++a) {
    if (!partial[a].out.defined()) {  // a query chunk that saw no key at all: zeros, lse -inf
      const at::Tensor rows = chunk_rows(q, static_cast<int64_t>(a), length);
      partial[a] = {at::zeros(rows.sizes(), rows.options().dtype(at::kFloat)),
                    at::full({rows.size(0), rows.size(1), length}, -std::numeric_limits<double>::infinity(), rows.options().dtype(at::kFloat))};
    }
    outs.push_back(partial[a].out);
    lses.push_back(partial[a].lse.to(at::kFloat));
  }
  // Token-major ([B, T, H, D] in memory), as one process's fused attention returns it: the
  // model's transpose(1, 2).reshape for the output projection is then a view, so the projection's
  // saved input is the output RingFunction saves, not a second copy (1h per own token and layer).
  const at::Tensor merged = at::cat(outs, 2);
  at::Tensor out = at::empty({merged.size(0), merged.size(2), merged.size(1), merged.size(3)}, q.options()).transpose(1, 2);
  out.copy_(merged);
  return {out, at::cat(lses, 2)};
}

std::array<at::Tensor, 3> ContextAttention::ring_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                          const at::Tensor& out, const at::Tensor& lse, const at::Tensor& d_out,
                                                          const RingMask& mask) const {
  Communicator& ring = *outer_;
  const int r = ring.size();
  const int64_t length = split_.chunk_length();
  at::Tensor dq = at::zeros(q.sizes(), q.options().dtype(at::kFloat));
  at::Tensor block = at::stack({k, v}), own_gradient;
  std::optional<Rotation> gradient;  // the accumulated gradient of the block held next, on its way here
  for (int step = 0; step < r; ++step) {
    std::optional<Rotation> rotation;
    if (step + 1 < r) rotation = start_rotation(block, ring, *ring_bytes_);
    at::Tensor contribution = at::zeros(block.sizes(), block.options().dtype(at::kFloat));
    for (const ChunkPair& pair : step_pairs(step, mask, q.device())) {
      // The merged output and lse: this pair's share of the whole attention's gradients.
      const ops::AttentionGradients g =
          ops::attention_backward(chunk_rows(q, pair.query, length), chunks_rows(block[0], pair.key_blocks, length),
                                  chunks_rows(block[1], pair.key_blocks, length), chunk_rows(out, pair.query, length),
                                  lse.narrow(-1, pair.query * length, length), chunk_rows(d_out, pair.query, length), pair.mask);
      chunk_rows(dq, pair.query, length).add_(g.dq);
      for (size_t i = 0; i < pair.key_blocks.size(); ++i) {
        const int64_t seen = static_cast<int64_t>(i);
        chunk_rows(contribution[0], pair.key_blocks[i], length).add_(chunk_rows(g.dk, seen, length));
        chunk_rows(contribution[1], pair.key_blocks[i], length).add_(chunk_rows(g.dv, seen, length));
      }
    }
    if (step == 0) {
      own_gradient = contribution;
    } else {  // add this rank's share to what the earlier holders of the block sent, pass it on
      if (gradient) {
        gradient->work->wait();
        contribution += gradient->received;
      }
      gradient = start_gradient_rotation(contribution.to(block.scalar_type()), ring, *ring_bytes_);
    }
    if (rotation) {
      rotation->work->wait();
      block = rotation->received;
    }
  }
  gradient->work->wait();  // this rank's own block's gradient from every other ring rank
  const at::Tensor d_block = own_gradient + gradient->received;
  return {dq.to(q.scalar_type()), d_block[0].to(k.scalar_type()), d_block[1].to(v.scalar_type())};
}

}  // namespace strata::context_parallel
