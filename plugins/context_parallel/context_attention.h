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
// whatever order the tokens arrive in. Autograd differentiates all of it: backward sends the
// key/value gradients back around the ring (not overlapped with compute).
#pragma once

#include <atomic>
#include <memory>

#include <ATen/core/Tensor.h>

#include "sequence_split.h"
#include "strata/comm.h"
#include "strata/ops.h"

namespace strata::context_parallel {

class ContextAttention {
 public:
  // `context_rank` in the context group of `split.ranks` ranks; `inner` holds context ranks
  // [o u, (o + 1) u) for o = context_rank / u, `outer` those equal to context_rank modulo u.
  ContextAttention(SequenceSplit split, int context_rank, std::shared_ptr<Communicator> inner, std::shared_ptr<Communicator> outer);
  // q, k, v: this rank's tokens [B, H, T/c, D]; `local` the mask core built for them.
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ops::AttentionMask& local) const;
  // Bytes of key/value blocks and their gradients this rank sent around the ring so far.
  int64_t ring_bytes() const { return ring_bytes_->load(); }

 private:
  // The chunks the inner group with outer index `outer_rank` holds, in the order Ulysses
  // gathers its tokens.
  std::vector<int64_t> group_chunks(int outer_rank) const;
  at::Tensor ring(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ops::AttentionMask& local,
                  const at::Tensor& documents) const;

  SequenceSplit split_;
  int context_rank_;
  std::shared_ptr<Communicator> inner_, outer_;
  std::shared_ptr<std::atomic<int64_t>> ring_bytes_;
};

}  // namespace strata::context_parallel
