// The `linear` operator through oneDNN on the CPU (fp32): y = x W^T + b. On this project's
// CPU (AMD Zen 4, AVX-512) MKL's sgemm, which at::linear calls, runs the forward GEMMs of the
// bench GPTs at 136-191 GF/s and oneDNN's at 150-209 (bench/results/gemm_cpu.md: forward
// 0.84-0.98x MKL's time, grad input 0.89-1.08x). The weight gradient goes through oneDNN's
// matmul on transposed views (0.85-1.0x MKL's time, bench/results/gemm_cpu.md, "weight
// gradient"); oneDNN's linear needed copies there and was 1.2-1.8x slower. Parity with core's
// reference: tests/unit/linear_onednn_test.cpp; time in the step: bench/fused_step_time.py.
#pragma once

#include <optional>

#include <ATen/core/Tensor.h>

namespace strata::kernels {

// Whether oneDNN's linear (mkldnn::_linear_pointwise) serves the forward and input gradient here:
// this libtorch carries it, a trial call runs, and STRATA_CPU_FALLBACK does not name
// "onednn_linear". The implementation is registered only where it does. Decided once, recorded
// (strata/cpu.h).
bool onednn_linear_chosen();

// Whether oneDNN's matmul (at::native::mkldnn_matmul) serves the weight gradient here: libtorch
// exports it, the CPU has AVX-512 BW/VL/DQ or AVX-NE-CONVERT (oneDNN refuses every call
// otherwise), a trial call runs, and STRATA_CPU_FALLBACK does not name "onednn_matmul". Else the
// weight gradient is at::mm's (MKL). Decided once, recorded.
bool onednn_matmul_chosen();

// dW = dy^T rows ([out, in] from dy [N, out] and rows [N, in], fp32): what the backward computes
// for the weight, through oneDNN's matmul where chosen, else at::mm.
at::Tensor linear_weight_gradient(const at::Tensor& dy, const at::Tensor& rows);

// Whether bf16 or fp16 GEMMs run in fp32 on the widened operands here: ATen's oneDNN has no GEMM
// in that type on this CPU (mkldnn::_is_mkldnn_bf16_supported / _fp16_ say no, and ATen's own
// would be scalar) and STRATA_CPU_FALLBACK does not name "bf16_gemm_via_fp32" /
// "fp16_gemm_via_fp32". A Linear's then run here, and attention's in the blocked kernel
// (attention.cpp) rather than ATen's SDPA. Else ATen runs them. Decided once per type, recorded.
bool half_gemms_via_fp32(at::ScalarType half);

// What "linear.onednn_cpu" runs on CPU tensors. fp32 without autocast: oneDNN where chosen. bf16
// or fp16 (the operands', or autocast's): fp32 GEMMs where chosen. Anything else (double, mixed
// types, an empty input or weight, a path not chosen) goes to at::linear, the reference.
at::Tensor linear_onednn_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias);

}  // namespace strata::kernels
