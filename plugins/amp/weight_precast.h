// Weight precast (amp's `precast_weights`): one multi-tensor cast per block in place of one cast
// per Linear weight and bias.
//
// Under autocast every Linear casts its fp32 weight and bias to the compute dtype in a kernel of
// their own, and backward casts each gradient back in another: GPT-2 124M launches about 100 such
// pairs a step, a fifth of its launches, which on a GPU the host cannot issue as fast as the device
// runs them (issue 63's profile: the device idles about 5 ms of a 29 ms step). With precast, the
// first Linear of a block that a forward reaches casts all of that block's plain Linear weights and
// biases in one `at::_foreach_copy_` (one launch on CUDA), through one autograd node whose backward
// casts their gradients back in one more. Both casts round as autocast's do (to nearest even, then
// exactly back), so the losses are bit-identical to plain autocast.
//
// Plain means no other pass intercepts the layer: layers with on_weight/on_bias hooks (tensor
// parallel), a compute hook (fp8, fused_loss) or a split weight gradient (pipeline) keep
// autocast's own casts. Parameters already in the compute dtype (fsdp's bf16 gathers) are left as
// they are. The copies live for one forward (cleared where autocast clears its cache); one made
// without gradients (evaluation, a checkpointed block's first pass) is never served to a forward
// that records them.
#pragma once

#include <memory>

#include "strata/plugin.h"

namespace strata::amp {

// Installs the precast on every plain Linear of job.model (at the first forward, once every pass
// has set its hooks) and clears the copies after each forward and evaluation. Reports
// `amp_precast_tensors`, the parameters the last forward took from a precast, in each step's
// metrics.
void install_weight_precast(Job& job, c10::ScalarType compute_dtype);

}  // namespace strata::amp
