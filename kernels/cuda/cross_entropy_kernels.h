// Launcher of the fused cross-entropy kernel (cross_entropy_kernels.cu, nvcc, no libtorch
// headers): the arithmetic of cross_entropy.fused_cpu (cpu/cross_entropy.cpp) on a GPU. For row
// i with logits z_i (V of them, any of `Storage`) and target t_i:
//   row_loss_i = lse(z_i) - z_i[t_i]                       (0 where t_i = -100)
//   grad_i     = exp(z_i - lse(z_i)) - onehot(t_i)          (float; 0 where t_i = -100)
// both in float arithmetic. grad is left unscaled: the caller multiplies it by g / C (C the
// counted rows) in the backward, so no count has to reach the host. A target outside [0, V)
// that is not -100 makes its row's loss and gradient NaN (the kernel cannot raise; ATen's CUDA
// loss stops the process with a device assert instead). grad may be null (evaluation). Rows are
// `ld` apart in logits and grad (ld >= vocab): columns [vocab, ld) are padding, not used in the
// logits (any values, NaN included; a 16-byte load may fetch them) and written 0 in grad (the chunked linear + cross-entropy pads its GEMMs' vocabulary).
// grad's storage: float for any logits, or bf16/half for float logits or logits of the same
// type (G rounded once, for GEMMs in that dtype); other pairs return cudaErrorInvalidValue. Returns cudaGetLastError() as an int
// (0: launched). `stream` is a cudaStream_t.
#pragma once

#include <cstdint>

#include "activation_kernels.h"  // Storage

namespace strata::kernels::cuda {

int cross_entropy_forward(Storage logits_type, const void* logits, const int64_t* targets, Storage grad_type, void* grad,
                          float* row_loss, int64_t rows, int64_t vocab, int64_t ld, void* stream);

}  // namespace strata::kernels::cuda
