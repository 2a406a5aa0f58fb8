// The kernels plugin: registers the operator implementations under kernels/ (registration only;
// each kernel lives in its own file with its reference, test and bench named in README.md).
#include "cpu/activations.h"
#include "cpu/adamw.h"
#include "cpu/attention.h"
#include "cpu/cpu_paths.h"
#include "cpu/cross_entropy.h"
#include "cpu/linear_cross_entropy.h"
#include "cpu/linear_onednn.h"
#include "cpu/rms_norm.h"
#include "cuda/activations_cuda.h"
#include "cuda/adamw_fused.h"
#include "cuda/agd_cuda.h"
#include "cuda/cross_entropy_cuda.h"
#include "cuda/attention_sdpa.h"
#include "cuda/linear_cross_entropy_cuda.h"
#include "cuda/layer_norm_cuda.h"
#include "cuda/linear_cublaslt_cuda.h"
#include "cuda/rms_norm_cuda.h"
#include "cuda/rope_cuda.h"
#include "strata/plugin.h"

#include <cstdlib>
#include <string_view>

#ifdef STRATA_HAVE_CUDA_KERNELS
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace strata::kernels {
namespace {

void register_components(Registry& registry) {
#ifdef STRATA_HAVE_CUDA_KERNELS
  // STRATA_CUDA_SYNC_DEBUG=1: c10 warns at every call that makes the host wait for a CUDA device
  // (a read, a copy from pageable memory, a synchronize); scripts/gpu_check counts the warnings
  // to show that steps which neither log nor checkpoint wait for nothing.
  if (const char* debug = std::getenv("STRATA_CUDA_SYNC_DEBUG"); debug && std::string_view(debug) == "1")
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_WARN);
#endif
  // Priority 10 > the reference's 0: selected by default on CPU for these dtypes. Plain causal
  // and unmasked calls without lse still go to ATen's fused SDPA inside (see cpu/attention.cpp).
  registry.add(std::make_unique<ops::OperatorImpl<ops::Attention>>(
      "attention.fused_cpu",
      "blocked online-softmax attention (CPU): every mask without a [Tq, Tk] matrix, invisible blocks skipped, GQA "
      "without copies, differentiable lse; plain causal/unmasked calls without lse go to ATen SDPA",
      &attention_fused_cpu,
      ops::Support{{c10::DeviceType::CPU}, {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf}}, 10));
  registry.add(std::make_unique<ops::OperatorImpl<ops::AttentionBackward>>(
      "attention_backward.fused_cpu",
      "the blocked attention's backward pass on a given output and lse (CPU): no [Tq, Tk] matrix, invisible blocks "
      "skipped, GQA without copies",
      &attention_backward_fused_cpu,
      ops::Support{{c10::DeviceType::CPU}, {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf}}, 10));
  // CUDA: ATen's flash / cuDNN / memory-efficient kernels chosen per mask, lse differentiable.
  registry.add(std::make_unique<ops::OperatorImpl<ops::Attention>>(
      "attention.sdpa_cuda",
      "ATen's fused attention kernels (CUDA): flash/cuDNN/memory-efficient for plain causal or unmasked calls, the "
      "memory-efficient kernel with a 0/-inf bias for every other mask and for a differentiable lse (context parallel)",
      &attention_sdpa_cuda, ops::Support{{c10::DeviceType::CUDA}, {at::kFloat, at::kBFloat16, at::kHalf}}, 10));
  registry.add(std::make_unique<ops::OperatorImpl<ops::CrossEntropy>>(
      "cross_entropy.fused_cpu",
      "one pass per row: lse, the loss and the logits' gradient written in the forward (the backward scales it); no "
      "log-probabilities, no zero-filled [N, V]",
      &cross_entropy_fused_cpu, ops::Support{{c10::DeviceType::CPU}, {at::kFloat, at::kBFloat16, at::kHalf}}, 10));
  registry.add(std::make_unique<ops::OperatorImpl<ops::LinearCrossEntropy>>(
      "linear_cross_entropy.chunked_cpu",
      "chunks of rows (4 MiB of logits each): logits, log_softmax and the gradients while the chunk is in cache; the [N, V] "
      "logits never exist",
      &linear_cross_entropy_chunked_cpu,
      ops::Support{{c10::DeviceType::CPU}, {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf}}, 10));
  registry.add(std::make_unique<ops::OperatorImpl<ops::LinearCrossEntropy>>(
      "linear_cross_entropy.chunked_cuda",
      "chunks of rows (256 MiB of logits each, at least 1024 rows) through cuBLAS and ATen's CUDA kernels; the [N, V] logits "
      "never exist",
      &linear_cross_entropy_chunked_cuda, ops::Support{{c10::DeviceType::CUDA}, {at::kFloat, at::kBFloat16, at::kHalf}}, 10));
  // Decided here, once per process, with the other CPU paths (cpu_features.h; `strata ops`).
  decide_cpu_paths();
  std::vector<c10::ScalarType> linear_dtypes;
  if (onednn_linear_chosen()) linear_dtypes.push_back(at::kFloat);
  for (const c10::ScalarType half : {at::kBFloat16, at::kHalf})
    if (half_gemms_via_fp32(half)) linear_dtypes.push_back(half);
  if (!linear_dtypes.empty())
    registry.add(std::make_unique<ops::OperatorImpl<ops::Linear>>(
        "linear.onednn_cpu",
        "fp32: forward and input gradient through oneDNN's linear, weight gradient through oneDNN's matmul where the CPU has "
        "AVX-512 else MKL; bf16/fp16 where ATen's oneDNN has no GEMM in that type: the same GEMMs in fp32 on the widened "
        "operands (`strata ops` lists which); everything else to at::linear",
        &linear_onednn_cpu, ops::Support{{c10::DeviceType::CPU}, linear_dtypes}, 10));
  registry.add(std::make_unique<ops::OperatorImpl<ops::Gelu>>(
      "gelu.fused_cpu", "tanh GELU as x sigmoid(2u): one vectorised pass forward, one backward (float arithmetic)",
      &gelu_tanh_fused_cpu, ops::Support{{c10::DeviceType::CPU}, {at::kFloat, at::kBFloat16, at::kHalf}}, 10));
  registry.add(std::make_unique<ops::OperatorImpl<ops::SwiGlu>>(
      "swiglu.fused_cpu", "silu(gate) * up: one vectorised pass forward, one backward giving both gradients (float arithmetic)",
      &swiglu_fused_cpu, ops::Support{{c10::DeviceType::CPU}, {at::kFloat, at::kBFloat16, at::kHalf}}, 10));
#ifdef STRATA_HAVE_CUDA_KERNELS
  // Priority 0, opt-in: served only where a strategy pins it (module_replace) until a GPU run has
  // measured it against ATen's backward (cuda/linear_cublaslt_cuda.h).
  registry.add(std::make_unique<ops::OperatorImpl<ops::Linear>>(
      "linear.cublaslt_cuda",
      "bf16/fp16 with a bias (also under autocast): ATen's forward and input gradient; the weight gradient and the bias "
      "gradient in one cuBLASLt GEMM (BGRADB epilogue), not a GEMM and a column sum; others to at::linear",
      &linear_cublaslt_cuda, ops::Support{{c10::DeviceType::CUDA}, {at::kFloat, at::kBFloat16, at::kHalf}}, 0));
  registry.add(std::make_unique<ops::OperatorImpl<ops::Gelu>>(
      "gelu.fused_cuda", "tanh GELU as x sigmoid(2u): one CUDA kernel forward, one backward (float arithmetic)",
      &gelu_tanh_fused_cuda, ops::Support{{c10::DeviceType::CUDA}, {at::kFloat, at::kBFloat16, at::kHalf}}, 10));
  registry.add(std::make_unique<ops::OperatorImpl<ops::SwiGlu>>(
      "swiglu.fused_cuda", "silu(gate) * up: one CUDA kernel forward, one backward giving both gradients (float arithmetic)",
      &swiglu_fused_cuda, ops::Support{{c10::DeviceType::CUDA}, {at::kFloat, at::kBFloat16, at::kHalf}}, 10));
  registry.add(std::make_unique<ops::OperatorImpl<ops::CrossEntropy>>(
      "cross_entropy.fused_cuda",
      "one CUDA kernel forward, a block per row: lse, the loss terms and the float logits' gradient; the backward scales it "
      "by g / C on the device (no log-probabilities, no zero-filled [N, V], no host read)",
      &cross_entropy_fused_cuda, ops::Support{{c10::DeviceType::CUDA}, {at::kFloat, at::kBFloat16, at::kHalf}}, 10));
  registry.add(std::make_unique<ops::OperatorImpl<ops::LayerNorm>>(
      "layer_norm.fused_cuda",
      "fp32: one CUDA kernel forward, a warp per row up to 1024 wide, else a block (two-pass variance); one backward giving dx, dw "
      "and db in one pass over x and dy (ATen runs two kernels)",
      &layer_norm_fused_cuda, ops::Support{{c10::DeviceType::CUDA}, {at::kFloat}}, 10));
  // Opt-in (priority 0): not yet run on a GPU, and not the reference's dtype contract under autocast.
  // bf16/fp16 listed for module_replace's plan check (amp's compute dtype); 16-bit x goes to
  // layer_norm.fused_cuda, i.e. the reference.
  registry.add(std::make_unique<ops::OperatorImpl<ops::LayerNorm>>(
      "layer_norm.autocast_out_cuda",
      "layer_norm.fused_cuda's kernels with the output in autocast's bf16/fp16 (rounded once) and dy read in it: no cast "
      "kernel after the norm or before its backward; for norms that feed Linears",
      &layer_norm_autocast_out_cuda, ops::Support{{c10::DeviceType::CUDA}, {at::kFloat, at::kBFloat16, at::kHalf}}, 0));
  registry.add(std::make_unique<ops::OperatorImpl<ops::RmsNorm>>(
      "rms_norm.fused_cuda",
      "one CUDA kernel per direction, a block per row: fp32 sum of squares, the reference's roundings; saves one float per row",
      &rms_norm_fused_cuda, ops::Support{{c10::DeviceType::CUDA}, {at::kFloat, at::kBFloat16, at::kHalf}}, 10));
  // Opt-in (priority 0): not yet run on a GPU, and not the reference's dtype contract under autocast.
  registry.add(std::make_unique<ops::OperatorImpl<ops::RmsNorm>>(
      "rms_norm.autocast_out_cuda",
      "rms_norm.fused_cuda's kernels with fp32 x and weight under autocast: the output in autocast's bf16/fp16 (rounded "
      "once) and dy read in it; for norms that feed Linears",
      &rms_norm_autocast_out_cuda, ops::Support{{c10::DeviceType::CUDA}, {at::kFloat, at::kBFloat16, at::kHalf}}, 0));
  // Opt-in (priority 0) until a GPU has run them.
  registry.add(std::make_unique<ops::OperatorImpl<ops::AddLayerNorm>>(
      "add_layer_norm.fused_cuda",
      "the residual add in layer_norm.fused_cuda's forward kernel, the residual gradient added and the 16-bit branch's "
      "gradient stored in its backward: bit for bit the add and that norm, three kernels fewer per residual step",
      &add_layer_norm_fused_cuda, ops::Support{{c10::DeviceType::CUDA}, {at::kFloat, at::kBFloat16, at::kHalf}}, 0));
  registry.add(std::make_unique<ops::OperatorImpl<ops::AddRmsNorm>>(
      "add_rms_norm.fused_cuda",
      "the residual add in rms_norm.fused_cuda's forward kernel, the residual gradient added and the 16-bit branch's "
      "gradient stored in its backward: bit for bit the add and that norm",
      &add_rms_norm_fused_cuda, ops::Support{{c10::DeviceType::CUDA}, {at::kFloat, at::kBFloat16, at::kHalf}}, 0));
  // Opt-in (priority 0) until a GPU has run it.
  registry.add(std::make_unique<ops::OperatorImpl<ops::Rope>>(
      "rope.fused_cuda",
      "one CUDA kernel each way, x read through its strides (the heads' transposed view), the reference's roundings: "
      "no narrows, products, cat and zero-filled gradients",
      &rope_fused_cuda, ops::Support{{c10::DeviceType::CUDA}, {at::kFloat, at::kBFloat16, at::kHalf}}, 0));
  registry.add(std::make_unique<ops::OperatorImpl<ops::AgdUpdate>>(
      "agd_update.fused_cuda", "AGD step in one CUDA kernel per parameter, the reference's operations in order (fp32)",
      &agd_update_fused_cuda, ops::Support{{c10::DeviceType::CUDA}, {at::kFloat}}, 10));
#endif
  registry.add(std::make_unique<ops::OperatorImpl<ops::RmsNorm>>(
      "rms_norm.fused_cpu",
      "one pass per row forward and backward over ATen's threads: fp32 sums, the reference's roundings; saves one float per row",
      &rms_norm_fused_cpu, ops::Support{{c10::DeviceType::CPU}, {at::kFloat, at::kBFloat16, at::kHalf}}, 10));
  registry.add(std::make_unique<ops::OperatorImpl<ops::AddRmsNorm>>(
      "add_rms_norm.fused_cpu",
      "the residual add inside rms_norm.fused_cpu's pass over each row, and the residual gradient added in its backward: "
      "bit for bit the add and that norm, without the add's pass forward and the accumulation's backward",
      &add_rms_norm_fused_cpu, ops::Support{{c10::DeviceType::CPU}, {at::kFloat, at::kBFloat16, at::kHalf}}, 10));
  registry.add(std::make_unique<ops::OperatorImpl<ops::AdamwUpdate>>(
      "adamw_update.fused_cpu", "AdamW step in one vectorised pass over each tensor, the reference's operations in order (fp32)",
      &adamw_update_fused_cpu, ops::Support{{c10::DeviceType::CPU}, {at::kFloat}}, 10));
  registry.add(std::make_unique<ops::OperatorImpl<ops::AdamwUpdate>>(
      "adamw_update.fused_cuda", "AdamW step of a parameter group in multi-tensor CUDA launches (ATen's fused AdamW, the reference's rule)",
      &adamw_update_fused_cuda, ops::Support{{c10::DeviceType::CUDA}, {at::kFloat}}, 10));
}

}  // namespace
}  // namespace strata::kernels

STRATA_PLUGIN("kernels", "0.1.0", strata::kernels::register_components)
