#include "context_attention.h"

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
// gradient of the received block, sent back to where it came from.
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

// Two partial attentions of the same queries over disjoint keys, merged by their log-sum-exp.
// The running output stays in fp32 (a.out) so half precision rounds once, at the end.
ops::AttentionResult merge(const ops::AttentionResult& a, const ops::AttentionResult& b) {
  const at::Tensor lse = at::logaddexp(a.lse, b.lse);
  return {a.out * at::exp(a.lse - lse).unsqueeze(-1) + b.out.to(a.out.scalar_type()) * at::exp(b.lse - lse).unsqueeze(-1), lse};
}

at::Tensor chunk_rows(const at::Tensor& x, int64_t position, int64_t length) { return x.narrow(-2, position * length, length); }

}  // namespace

ContextAttention::ContextAttention(SequenceSplit split, int context_rank, std::shared_ptr<Communicator> inner,
                                   std::shared_ptr<Communicator> outer)
    : split_(split), context_rank_(context_rank), inner_(std::move(inner)), outer_(std::move(outer)),
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
    out = ring(query, key, value, local, documents);
  }
  return u > 1 ? dist::all_to_all(out, 2, 1, *inner_) : out;
}

at::Tensor ContextAttention::ring(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ops::AttentionMask& local,
                                  const at::Tensor& documents) const {
  const bool causal = local.causal;
  Communicator& ring = *outer_;
  const int r = ring.size(), me = ring.rank();
  const int64_t length = split_.chunk_length();
  const std::vector<int64_t> mine = group_chunks(me);
  const at::Device device = q.device();
  auto index_of = [&](const std::vector<int64_t>& chunks) { return split_.token_index(chunks, device); };
  std::vector<ops::AttentionResult> partial(mine.size());
  at::Tensor block = at::stack({k, v});  // one message per step
  at::Tensor unused;  // blocks this rank's queries never see, kept in the graph (see below)
  for (int step = 0; step < r; ++step) {
    const std::vector<int64_t> theirs = group_chunks((me - step + r) % r);
    std::unique_ptr<Rotation> rotation;
    if (step + 1 < r) rotation = std::make_unique<Rotation>(start_rotation(block, ring, *ring_bytes_));
    bool used = false;
    for (size_t a = 0; a < mine.size(); ++a) {
      std::vector<int64_t> seen, seen_positions;
      bool diagonal = false;
      for (size_t b = 0; b < theirs.size(); ++b) {
        if (causal && theirs[b] > mine[a]) continue;  // entirely in this query chunk's future
        diagonal = diagonal || theirs[b] == mine[a];
        seen.push_back(theirs[b]);
        seen_positions.push_back(static_cast<int64_t>(b));
      }
      if (seen.empty()) continue;
      used = true;
      std::vector<at::Tensor> keys, values;
      for (int64_t b : seen_positions) {
        keys.push_back(chunk_rows(block[0], b, length));
        values.push_back(chunk_rows(block[1], b, length));
      }
      ops::AttentionMask mask;
      // Off the diagonal every key precedes every query, unless a sliding window hides the older ones.
      mask.causal = causal && (diagonal || local.sliding_window > 0);
      mask.sliding_window = local.sliding_window;
      const at::Tensor q_index = index_of({mine[a]}), kv_index = index_of(seen);
      if (mask.causal) {
        mask.q_index = q_index;
        mask.kv_index = kv_index;
      }
      if (documents.defined()) {
        mask.q_document = documents.index_select(1, q_index);
        mask.kv_document = documents.index_select(1, kv_index);
      }
      ops::AttentionResult result =
          ops::attention(chunk_rows(q, static_cast<int64_t>(a), length), at::cat(keys, 2), at::cat(values, 2), mask, /*with_lse=*/true);
      if (!partial[a].out.defined()) result.out = result.out.to(at::promote_types(result.out.scalar_type(), at::kFloat));
      partial[a] = partial[a].out.defined() ? merge(partial[a], result) : result;
    }
    // Every rank must run every rotation's backward (its ring partners wait for the message), so
    // a received block no query uses still joins the graph, with a zero gradient.
    // (One element times zero: a sum of a half-precision block could overflow to inf, and inf * 0 is NaN.)
    if (!used) {
      const at::Tensor zero = (block.reshape(-1).narrow(0, 0, 1) * 0.0).sum();
      unused = unused.defined() ? unused + zero : zero;
    }
    if (rotation)
      block = ReceivedBlock::apply(block, reinterpret_cast<int64_t>(rotation.get()), reinterpret_cast<int64_t>(&ring),
                                   reinterpret_cast<int64_t>(ring_bytes_.get()));
  }
  std::vector<at::Tensor> outs;
  for (const auto& p : partial) outs.push_back(p.out);
  at::Tensor out = at::cat(outs, 2).to(q.scalar_type());
  return unused.defined() ? out + unused.to(out.scalar_type()) : out;
}

}  // namespace strata::context_parallel
