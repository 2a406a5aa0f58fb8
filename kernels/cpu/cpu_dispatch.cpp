// Chooses, once, the compiled copy of each per-capability file this CPU runs (attention_rows.h,
// activation_math.h, adamw_rows.h), as ATen's DispatchStub does for its own kernels: AVX2+FMA+F16C where the
// CPU has them (as libtorch's cpuinfo reads it) and STRATA_CPU_FALLBACK does not name "avx2", else the
// generic copy; and decides every CPU path of the kernels at once (cpu_paths.h).
#include "cpu_paths.h"

#include "activation_math.h"
#include "adamw_rows.h"
#include "attention_rows.h"
#include "blas.h"
#include "linear_onednn.h"
#include "strata/cpu.h"

namespace strata::kernels {
namespace {

CpuPathChoice decide_avx2_copies() {
  CpuPathChoice c{"avx2", "vectorised rows: attention softmax, GELU/SwiGLU, AdamW", "generic copy (SSE2)", "", false};
#if defined(STRATA_HAVE_AVX2_COPIES)
  if (cpu_fallback_forced(c.path)) c.why = "forced by STRATA_CPU_FALLBACK";
  else if (!(cpu_has(CpuFeature::avx2) && cpu_has(CpuFeature::fma) && cpu_has(CpuFeature::f16c))) c.why = "this CPU lacks AVX2, FMA or F16C";
  else c.chosen = "AVX2+FMA copy", c.fast = true, c.why = "this CPU has AVX2, FMA and F16C";
#else
  c.why = "built without the AVX2 copies (not x86-64)";
#endif
  return c;
}

bool cpu_has_avx2() {
  static const bool chosen = decide_cpu_path(&decide_avx2_copies);
  return chosen;
}

}  // namespace

void decide_cpu_paths() {
  cpu_has_avx2();
  onednn_linear_chosen();
  onednn_matmul_chosen();
  half_gemms_via_fp32(at::kBFloat16);  // decides fp16's too
  brgemm_chosen();
}

#if defined(STRATA_HAVE_AVX2_COPIES)
#define STRATA_PICK(name) (cpu_has_avx2() ? avx2::name() : generic::name())
#else
#define STRATA_PICK(name) generic::name()
#endif

const AttentionRowOps<float>& attention_row_ops_float() {
  static const AttentionRowOps<float>& ops = STRATA_PICK(row_ops_float);
  return ops;
}

const AttentionRowOps<double>& attention_row_ops_double() { return generic::row_ops_double(); }

const char* attention_row_ops_capability() { return cpu_has_avx2() ? "avx2" : "generic"; }

template <>
const ActivationOps<float>& activation_ops<float>() {
  static const ActivationOps<float>& ops = STRATA_PICK(activation_ops_float);
  return ops;
}
template <>
const ActivationOps<c10::BFloat16>& activation_ops<c10::BFloat16>() {
  static const ActivationOps<c10::BFloat16>& ops = STRATA_PICK(activation_ops_bf16);
  return ops;
}
template <>
const ActivationOps<c10::Half>& activation_ops<c10::Half>() {
  static const ActivationOps<c10::Half>& ops = STRATA_PICK(activation_ops_half);
  return ops;
}

AdamwRows adamw_rows() {
#if defined(STRATA_HAVE_AVX2_COPIES)
  static const AdamwRows rows = cpu_has_avx2() ? &avx2::adamw_rows : &generic::adamw_rows;
#else
  static const AdamwRows rows = &generic::adamw_rows;
#endif
  return rows;
}

#undef STRATA_PICK

}  // namespace strata::kernels
