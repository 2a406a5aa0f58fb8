// Chooses the compiled copy of attention_rows.cpp this CPU runs (attention_rows.h).
#include "attention_rows.h"

namespace strata::kernels {
namespace {

bool cpu_has_avx2() {
#if defined(STRATA_HAVE_AVX2_ROWS)
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

}  // namespace

const AttentionRowOps<float>& attention_row_ops_float() {
#if defined(STRATA_HAVE_AVX2_ROWS)
  static const AttentionRowOps<float>& ops = cpu_has_avx2() ? avx2::row_ops_float() : generic::row_ops_float();
#else
  static const AttentionRowOps<float>& ops = generic::row_ops_float();
#endif
  return ops;
}

const AttentionRowOps<double>& attention_row_ops_double() { return generic::row_ops_double(); }

const char* attention_row_ops_capability() { return cpu_has_avx2() ? "avx2" : "generic"; }

}  // namespace strata::kernels
