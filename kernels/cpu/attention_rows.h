// The per-row softmax arithmetic of one attention tile (kernels/cpu/attention.cpp), vectorised
// with ATen's at::vec. attention_rows.cpp is compiled once per CPU capability (generic, and AVX2
// with FMA), each copy in its own namespace; row_ops() picks the best one this CPU runs, once, as
// ATen's DispatchStub does for its own kernels. All pointers are row-major tiles of nq rows with
// a stride of `ld` elements.
#pragma once

#include <cstdint>

namespace strata::kernels {

template <class T>
struct AttentionRowOps {
  // Online softmax over one tile of scores s, for row i (m, l: the running max and sum):
  //   m' = max(m, max_j s), s = exp(s - m'), l = l alpha + sum_j s, alpha = exp(m - m');
  // alpha[i] is what the row's output accumulator must be multiplied by (0 while m was -inf;
  // a row that has seen only -inf keeps m = -inf and gets s = 0).
  void (*online_softmax)(T* s, int64_t nq, int64_t nk, int64_t ld, T* m, T* l, T* alpha);
  // s = exp(s - shift[i]) per row (shift +inf gives zeros).
  void (*exp_shifted)(T* s, int64_t nq, int64_t nk, int64_t ld, const T* shift);
  // dp = p (dp - delta[i]): the softmax's backward, dS from P and dP.
  void (*softmax_backward)(const T* p, T* dp, int64_t nq, int64_t nk, int64_t ld, const T* delta);
  // x[i, :] *= factor[i] (rows whose factor is 1 are left alone).
  void (*scale_rows)(T* x, int64_t nq, int64_t n, int64_t ld, const T* factor);
};

// The implementation for this CPU: AVX2+FMA where the CPU has them (float), else generic.
const AttentionRowOps<float>& attention_row_ops_float();
const AttentionRowOps<double>& attention_row_ops_double();
// Which one attention_row_ops_float() chose: "avx2" or "generic" (for benches and logs).
const char* attention_row_ops_capability();

// Each compiled copy (attention_rows.cpp) defines these in namespace `generic` and, on x86-64,
// `avx2`.
namespace generic {
const AttentionRowOps<float>& row_ops_float();
const AttentionRowOps<double>& row_ops_double();
}  // namespace generic
namespace avx2 {
const AttentionRowOps<float>& row_ops_float();
}  // namespace avx2

}  // namespace strata::kernels
