// Differentiable collectives for model-parallel passes (tensor, sequence and context parallel):
// each is a collective over `group` in the forward and its conjugate in the backward, recorded by
// autograd. Every rank of the group must run the same calls in the same order, forward and
// backward (autograd does, when every rank runs the same graph). `group` must outlive the
// backward pass: take it from the job's topology. On a group of one rank each is the identity.
#pragma once

#include <ATen/core/Tensor.h>

#include "strata/comm.h"

namespace strata::dist {

// Forward identity, backward all-reduce (sum): enters a tensor-parallel region whose ranks each
// use the whole input (Megatron's "f", before a column-parallel GEMM).
STRATA_API at::Tensor copy_to_group(const at::Tensor& x, Communicator& group);

// Forward all-reduce (sum), backward identity: leaves the region (Megatron's "g", after a
// row-parallel GEMM).
STRATA_API at::Tensor reduce_from_group(const at::Tensor& x, Communicator& group);

// Forward all-gather along `dim` (pieces concatenated in group-rank order), backward
// reduce-scatter (sum) along `dim`: sequence parallel's entry into a column-parallel GEMM.
STRATA_API at::Tensor gather_along(const at::Tensor& x, int64_t dim, Communicator& group);

// Forward reduce-scatter (sum) along `dim` (its size divisible by the group size), backward
// all-gather along `dim`: sequence parallel's exit from a row-parallel GEMM.
STRATA_API at::Tensor reduce_scatter_along(const at::Tensor& x, int64_t dim, Communicator& group);

// Forward this rank's chunk along `dim` (no communication), backward all-gather along `dim`.
STRATA_API at::Tensor scatter_along(const at::Tensor& x, int64_t dim, Communicator& group);

// Forward: x split into group-size chunks along `scatter_dim`, chunk j sent to rank j, the
// received chunks concatenated along `gather_dim` in rank order (Ulysses: [b, s/c, h, d] ->
// [b, s, h/c, d] with scatter_dim 2, gather_dim 1). Backward: the inverse exchange.
STRATA_API at::Tensor all_to_all(const at::Tensor& x, int64_t scatter_dim, int64_t gather_dim, Communicator& group);

// Cross entropy over a vocabulary split across `group` (Megatron's vocab-parallel loss), without
// ever gathering the logits: `logits` [N, V/t] are this rank's vocabulary columns
// [vocab_start, vocab_start + V/t), `targets` [N] global token ids. Forward: three all-reduces
// (the row maximum, the sum of exponentials, the target's logit); backward: local (softmax minus
// the one-hot target on this rank's columns). Returns the mean over the N tokens, identical on
// every rank of the group; computed in fp32 whatever the logits' dtype.
STRATA_API at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets, int64_t vocab_start,
                                                   Communicator& group);

// Bytes the collectives above moved through this process since it started, forward and backward,
// by kind: all-reduce counts the tensor reduced, all-gather the gathered result, reduce-scatter
// the input before it is reduced, all-to-all the input (the sizes the communication-volume formulas
// of tensor and sequence parallel use). Passes report the change per step.
struct Traffic {
  int64_t all_reduce = 0, all_gather = 0, reduce_scatter = 0, all_to_all = 0;
};
STRATA_API Traffic traffic();

}  // namespace strata::dist
