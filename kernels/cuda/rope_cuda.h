// Fused rotary embedding on a GPU: the `rope` operator (Llama's q and k) in one kernel forward
// and one backward (cuda/rope_kernels.cu), bit for bit the reference's arithmetic, reading x
// through its strides (the heads' transposed view of a projection, as the Llama passes it).
// x float, bfloat16 or half with fp32 cos/sin tables that need no gradient; any other call goes
// to the reference. Written without a GPU (2026-11-30), so opt-in until one has run it:
// registered at priority 0, pinned with module_replace (`rope = "rope.fused_cuda"`). Parity:
// tests/gpu/rope_cuda_test.cpp; in training: scripts/gpu_check.
#pragma once

#include <ATen/core/Tensor.h>

namespace strata::kernels {

// What the operator implementation "rope.fused_cuda" runs.
at::Tensor rope_fused_cuda(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace strata::kernels
