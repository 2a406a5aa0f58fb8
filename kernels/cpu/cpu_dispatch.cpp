// Chooses, once, the compiled copy of each per-capability file this CPU runs (attention_rows.h,
// activation_math.h, adamw_rows.h), as ATen's DispatchStub does for its own kernels: AVX2+FMA where the CPU has
// them, else the generic copy.
#include "activation_math.h"
#include "adamw_rows.h"
#include "attention_rows.h"

namespace strata::kernels {
namespace {

bool cpu_has_avx2() {
#if defined(STRATA_HAVE_AVX2_COPIES)
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

}  // namespace

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
