// Every CPU path the kernels choose between (strata/cpu.h), decided at once: the
// kernels plugin calls this when it registers, so that a process decides before its first step
// and `strata ops` lists the choices. Each decision also happens on its own at first use.
//   avx2           the per-capability copies (cpu_dispatch.cpp): AVX2+FMA+F16C, else generic
//   onednn_linear  Linear forward and input gradient (linear_onednn.cpp): oneDNN, else at::linear
//   onednn_matmul  Linear weight gradient (linear_onednn.cpp): oneDNN's matmul, else at::mm
//   bf16_gemm_via_fp32, fp16_gemm_via_fp32  half-precision GEMMs (linear_onednn.cpp; attention.cpp): in
//                  fp32 on the widened operands where ATen's oneDNN has none in that type, else ATen's
//   brgemm         attention's tile products (blas.cpp): oneDNN's micro-kernel, else sgemm
#pragma once

namespace strata::kernels {

void decide_cpu_paths();

}  // namespace strata::kernels
