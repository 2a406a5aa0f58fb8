// The `linear` operator through oneDNN on the CPU (fp32): y = x W^T + b. On this project's
// CPU (AMD Zen 4, AVX-512) MKL's sgemm, which at::linear calls, runs the forward GEMMs of the
// bench GPTs at 136-191 GF/s and oneDNN's at 150-209 (bench/results/gemm_cpu.md: forward
// 0.84-0.98x MKL's time, grad input 0.89-1.08x, grad weight 1.2-1.8x slower). So the forward and
// the input gradient go through oneDNN and the weight gradient stays with MKL. Parity with
// core's reference: tests/unit/linear_onednn_test.cpp; time in the step:
// bench/fused_step_time.py.
#pragma once

#include <optional>

#include <ATen/core/Tensor.h>

namespace strata::kernels {

// Whether this libtorch carries oneDNN's linear (mkldnn::_linear_pointwise): the implementation
// is registered only where it does.
bool onednn_linear_available();

// What "linear.onednn_cpu" runs. fp32 CPU tensors; anything else (another dtype, autocast on, an
// empty input or weight) goes to at::linear, the reference.
at::Tensor linear_onednn_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias);

}  // namespace strata::kernels
