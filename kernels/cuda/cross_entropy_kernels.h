// Launcher of the fused cross-entropy kernel (cross_entropy_kernels.cu, nvcc, no libtorch
// headers): the arithmetic of cross_entropy.fused_cpu (cpu/cross_entropy.cpp) on a GPU. For row
// i with logits z_i (V of them, any of `Storage`) and target t_i:
//   row_loss_i = lse(z_i) - z_i[t_i]                       (0 where t_i = -100)
//   grad_i     = exp(z_i - lse(z_i)) - onehot(t_i)          (float; 0 where t_i = -100)
// both in float arithmetic. grad is left unscaled: the caller multiplies it by g / C (C the
// counted rows) in the backward, so no count has to reach the host. A target outside [0, V)
// that is not -100 makes its row's loss and gradient NaN (the kernel cannot raise; ATen's CUDA
// loss stops the process with a device assert instead). grad may be null (evaluation). Returns
// cudaGetLastError() as an int (0: launched). `stream` is a cudaStream_t.
#pragma once

#include <cstdint>

#include "activation_kernels.h"  // Storage

namespace strata::kernels::cuda {

int cross_entropy_forward(Storage logits_type, const void* logits, const int64_t* targets, float* grad, float* row_loss,
                          int64_t rows, int64_t vocab, void* stream);

}  // namespace strata::kernels::cuda
