// The row arithmetic of attention tiles (attention_rows.h), written once with at::vec and
// compiled per CPU capability: STRATA_CPU_NAMESPACE names the copy (generic, avx2) and the build
// sets ATen's CPU_CAPABILITY macros and compiler flags to match (kernels/CMakeLists.txt). Exp is
// at::vec's exp_u20 (a degree-5 polynomial, 20 ulp at most, what ATen's own CPU flash attention
// uses); the tails of rows that are no multiple of the vector width go through std::exp.
#include <algorithm>
#include <cmath>
#include <limits>

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include "attention_rows.h"

#ifndef STRATA_CPU_NAMESPACE
#error "compile attention_rows.cpp with STRATA_CPU_NAMESPACE set (kernels/CMakeLists.txt)"
#endif

namespace strata::kernels::STRATA_CPU_NAMESPACE {
namespace {

template <class T>
using Vec = at::vec::Vectorized<T>;

template <class T>
T row_max(const T* x, int64_t n) {
  constexpr int64_t w = Vec<T>::size();
  T best = -std::numeric_limits<T>::infinity();
  int64_t j = 0;
  if (n >= w) {
    Vec<T> acc = Vec<T>::loadu(x);
    for (j = w; j + w <= n; j += w) acc = at::vec::maximum(acc, Vec<T>::loadu(x + j));
    best = at::vec::vec_reduce_all<T>([](Vec<T>& a, Vec<T>& b) { return at::vec::maximum(a, b); }, acc);
  }
  for (; j < n; ++j) best = std::max(best, x[j]);
  return best;
}

// x = exp(x - shift); returns the sum of the new x.
template <class T>
T exp_and_sum(T* x, int64_t n, T shift) {
  constexpr int64_t w = Vec<T>::size();
  const Vec<T> vshift(shift);
  Vec<T> acc(T(0));
  int64_t j = 0;
  for (; j + w <= n; j += w) {
    const Vec<T> e = (Vec<T>::loadu(x + j) - vshift).exp_u20();
    e.store(x + j);
    acc = acc + e;
  }
  T sum = at::vec::vec_reduce_all<T>([](Vec<T>& a, Vec<T>& b) { return a + b; }, acc);
  for (; j < n; ++j) {
    x[j] = std::exp(x[j] - shift);
    sum += x[j];
  }
  return sum;
}

template <class T>
void online_softmax(T* s, int64_t nq, int64_t nk, int64_t ld, T* m, T* l, T* alpha) {
  const T inf = std::numeric_limits<T>::infinity();
  for (int64_t i = 0; i < nq; ++i) {
    T* row = s + i * ld;
    const T m_new = std::max(m[i], row_max(row, nk));
    // A row that has seen nothing yet stays at m = -inf: exp(-inf - 0) = 0 everywhere.
    const T shift = m_new == -inf ? T(0) : m_new;
    alpha[i] = m[i] == -inf ? T(0) : std::exp(m[i] - m_new);
    m[i] = m_new;
    l[i] = l[i] * alpha[i] + exp_and_sum(row, nk, shift);
  }
}

template <class T>
void exp_shifted(T* s, int64_t nq, int64_t nk, int64_t ld, const T* shift) {
  for (int64_t i = 0; i < nq; ++i) exp_and_sum(s + i * ld, nk, shift[i]);
}

template <class T>
void softmax_backward(const T* p, T* dp, int64_t nq, int64_t nk, int64_t ld, const T* delta) {
  constexpr int64_t w = Vec<T>::size();
  for (int64_t i = 0; i < nq; ++i) {
    const T* prow = p + i * ld;
    T* drow = dp + i * ld;
    const Vec<T> vdelta(delta[i]);
    int64_t j = 0;
    for (; j + w <= nk; j += w) (Vec<T>::loadu(prow + j) * (Vec<T>::loadu(drow + j) - vdelta)).store(drow + j);
    for (; j < nk; ++j) drow[j] = prow[j] * (drow[j] - delta[i]);
  }
}

template <class T>
void scale_rows(T* x, int64_t nq, int64_t n, int64_t ld, const T* factor) {
  constexpr int64_t w = Vec<T>::size();
  for (int64_t i = 0; i < nq; ++i) {
    if (factor[i] == T(1)) continue;
    T* row = x + i * ld;
    const Vec<T> f(factor[i]);
    int64_t j = 0;
    for (; j + w <= n; j += w) (Vec<T>::loadu(row + j) * f).store(row + j);
    for (; j < n; ++j) row[j] *= factor[i];
  }
}

template <class T>
const AttentionRowOps<T>& ops_for() {
  static const AttentionRowOps<T> ops{&online_softmax<T>, &exp_shifted<T>, &softmax_backward<T>, &scale_rows<T>};
  return ops;
}

}  // namespace

const AttentionRowOps<float>& row_ops_float() { return ops_for<float>(); }
#ifndef STRATA_CPU_COPY_AVX2
const AttentionRowOps<double>& row_ops_double() { return ops_for<double>(); }
#endif

}  // namespace strata::kernels::STRATA_CPU_NAMESPACE
