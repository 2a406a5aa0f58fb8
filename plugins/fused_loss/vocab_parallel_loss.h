// The output projection and the cross entropy together when tensor_parallel splits the
// vocabulary (Megatron's vocab-parallel cross entropy, fused with the projection as
// linear_cross_entropy fuses it on one rank).
#pragma once

#include <cstdint>
#include <optional>

#include <ATen/core/Tensor.h>

#include "strata/comm.h"

namespace strata::fused_loss {

// Mean over the N rows of lse(z_i) - z_i[t_i], where this rank holds the logits' columns
// [vocab_start, vocab_start + V_local): z_i = hidden_i weight^T + bias for its weight rows, and
// the tensor group holds the rest. hidden [N, D] is the same on every rank of the group; the
// gradient returned for it is this rank's part of dL/dh (the head's input hook sums the parts).
at::Tensor vocab_parallel_linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                               const at::Tensor& targets, int64_t vocab_start, Communicator& group);

}  // namespace strata::fused_loss
