// Attention over a sequence whose tokens are split across the context ranks (sequence_split.h).
// The context group of c = u x r ranks is an inner Ulysses group of u adjacent context ranks and
// an outer ring of r such groups (DeepSpeed-Ulysses for u = c, ring attention for r = c, 2-D in
// between: USP, LoongTrain, TorchAcc's FlashSequence):
//   1. Ulysses: an all-to-all turns the inner group's q, k, v from "my tokens, all heads" into
//      "the group's tokens, my 1/u of the heads" (kv heads are repeated first when grouped-query
//      heads do not divide by u).
//   2. Ring: each rank attends its queries to the key/value block it holds, while that block
//      travels on to the next ring rank over non-blocking point-to-point; after r steps every
//      query has seen every block. Partial results merge exactly by their log-sum-exp:
//        l = log(e^l1 + e^l2),  o = o1 e^(l1 - l) + o2 e^(l2 - l).
//      Work is done per chunk pair: a key chunk entirely after a query chunk is skipped (causal),
//      the diagonal one is masked causally, the others need no causal mask.
//   3. A second all-to-all restores "my tokens, all heads".
// Masks follow the window positions of the tokens, so causality and packed documents hold
// whatever order the tokens arrive in. Autograd differentiates the all-to-alls. The ring, two ways
// ([[pass]] context_parallel ring_backward):
//   autograd: autograd differentiates it too. Backward sends each received block's gradient back
//      around the ring; the graph holds every block seen and every partial result, the whole
//      sequence's keys and values per layer.
//   rotate: one autograd node (RingFunction) that keeps what single-process flash attention
//      keeps — this rank's q, k, v, the merged output and its log-sum-exp. Its backward rotates
//      the key/value blocks again, as Megatron's context parallel does, and runs the
//      attention_backward operator on each chunk pair with the merged output and lse: with
//      P = exp(S - lse) of the whole attention and delta = rowsum(dO o out), each block's dK,
//      dV and its share of dQ are exactly its part of the whole attention's gradients.
//      A block's key/value gradient collects its r contributions as it travels on, and the last
//      rank sends it home: (r - 1) blocks forward, (r - 1) blocks and (r - 1) gradients backward,
//      each received while the next chunk pairs compute.
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "sequence_split.h"
#include "strata/comm.h"
#include "strata/ops.h"

namespace strata::context_parallel {

struct RingFunction;

class ContextAttention {
 public:
  // `context_rank` in the context group of `split.ranks` ranks; `inner` holds context ranks
  // [o u, (o + 1) u) for o = context_rank / u, `outer` those equal to context_rank modulo u.
  // `rotate`: the ring keeps only q, k, v, out and lse and rotates the blocks again in backward
  // (above); otherwise autograd keeps every block seen and every partial result.
  ContextAttention(SequenceSplit split, int context_rank, std::shared_ptr<Communicator> inner, std::shared_ptr<Communicator> outer,
                   bool rotate);
  // q, k, v: this rank's tokens [B, H, T/c, D]; `local` the mask core built for them.
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ops::AttentionMask& local) const;
  // Bytes of key/value blocks and their gradients this rank sent around the ring so far.
  int64_t ring_bytes() const { return ring_bytes_->load(); }

 private:
  friend struct RingFunction;
  // What the ring's queries see: causality, sliding window, and the window's documents.
  struct RingMask {
    bool causal = false;
    int64_t sliding_window = 0;
    at::Tensor documents;  // [B, window] document ids; undefined: one document
  };
  // One query chunk of this rank against the key chunks it sees of the block held at a ring step.
  struct ChunkPair {
    int64_t query = 0;                // position of the query chunk in this rank's tokens
    std::vector<int64_t> key_blocks;  // positions of the chunks seen in the block's tokens
    ops::AttentionMask mask;
  };

  // The chunks the inner group with outer index `outer_rank` holds, in the order Ulysses
  // gathers its tokens.
  std::vector<int64_t> group_chunks(int outer_rank) const;
  // The chunk pairs of ring step `step` (the block of outer rank me - step), none entirely in
  // the future of its queries.
  std::vector<ChunkPair> step_pairs(int step, const RingMask& mask, const at::Device& device) const;
  ops::AttentionResult attend_pair(const at::Tensor& q, const at::Tensor& block, const ChunkPair& pair) const;
  // The ring's r steps, one loop for both ways: each rank's block travels on while the chunk
  // pairs of the block held compute; the partial results per query chunk of this rank (undefined
  // for a chunk that saw no key). `blocks_in_graph`: each received block joins autograd as a
  // function of the block sent (ring_backward autograd); otherwise blocks are plain tensors.
  std::vector<ops::AttentionResult> ring_steps(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const RingMask& mask,
                                               bool blocks_in_graph) const;
  // The ring under autograd: backward sends each received block's gradient back where it came
  // from, and the graph holds every block and partial result (ring_backward autograd).
  at::Tensor ring_keeping_blocks(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const RingMask& mask) const;
  // The ring as RingFunction (ring_backward rotate): forward (out in q's dtype, lse in fp32)
  // and backward (dq, dk, dv).
  ops::AttentionResult ring_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const RingMask& mask) const;
  std::array<at::Tensor, 3> ring_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                                          const at::Tensor& lse, const at::Tensor& d_out, const RingMask& mask) const;

  SequenceSplit split_;
  int context_rank_;
  bool rotate_;
  std::shared_ptr<Communicator> inner_, outer_;
  std::shared_ptr<std::atomic<int64_t>> ring_bytes_;
};

}  // namespace strata::context_parallel
