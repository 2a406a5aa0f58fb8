// Launchers of the fused activation kernels (activation_kernels.cu, compiled by nvcc without
// libtorch's headers so that it builds in seconds): GELU with the tanh approximation and SwiGLU,
// forward and backward, each one pass over contiguous arrays, float arithmetic on float, bfloat16
// or half storage; the same formulas as the CPU kernels (kernels/cpu/activation_math.h).
// `stream` is a cudaStream_t. Each returns cudaGetLastError() as an int (0: launched).
#pragma once

#include <cstdint>

namespace strata::kernels::cuda {

enum class Storage { Float, BFloat16, Half };

int gelu_tanh_forward(Storage type, const void* x, void* y, int64_t n, void* stream);
int gelu_tanh_backward(Storage type, const void* x, const void* dy, void* dx, int64_t n, void* stream);
int swiglu_forward(Storage type, const void* gate, const void* up, void* y, int64_t n, void* stream);
int swiglu_backward(Storage type, const void* gate, const void* up, const void* dy, void* dgate, void* dup, int64_t n,
                    void* stream);

}  // namespace strata::kernels::cuda
