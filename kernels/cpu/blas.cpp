// Row-major GEMM (blas.h) as a column-major BLAS call: a row-major X is the column-major X^T
// with the same leading dimension, so C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T, the
// operands swapped and their transpose flags kept.
#include "blas.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/native/CPUBlas.h>

#include "strata/cpu.h"

extern "C" {
// The reference BLAS interface (LP64) that libtorch_cpu exports (MKL on x86-64 wheels).
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c, const int* ldc);
void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const double* alpha,
            const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c, const int* ldc);
// MKL's per-thread thread count (returns the previous one; 0 = the global setting). Weak: absent
// where libtorch's BLAS is not MKL.
int MKL_Set_Num_Threads_Local(int n) __attribute__((weak));  // MKL's C name (mkl_set_num_threads_local is the Fortran one)
}

namespace strata::kernels {
namespace {

int checked(int64_t x) {
  if (x < 0 || x > (int64_t{1} << 31) - 1) throw std::length_error("kernels::gemm: a dimension does not fit a BLAS int");
  return static_cast<int>(x);
}

template <class T, class Fn>
void row_major(Fn blas, Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
               int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  const char tb_c = static_cast<char>(tb), ta_c = static_cast<char>(ta);
  const int mm = checked(n), nn = checked(m), kk = checked(k), la = checked(ldb), lb = checked(lda), lc = checked(ldc);
  blas(&tb_c, &ta_c, &mm, &nn, &kk, &alpha, b, &la, a, &lb, &beta, c, &lc);
}

}  // namespace

void gemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
          int64_t ldb, float beta, float* c, int64_t ldc) {
  row_major(sgemm_, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda, const double* b,
          int64_t ldb, double beta, double* c, int64_t ldc) {
  row_major(dgemm_, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

namespace {

// The micro-kernel's worst error over attention's tile shapes, as a multiple of fp32's rounding
// bound for each entry (eps times the sum of |a||b| over k, plus |c| when accumulating), against
// the product in double. Shapes as the kernel calls it: scores (K = head dim, B = K^T with an odd
// row stride), O += P V (K = a short last key block, C rows as wide as all heads), and a full
// 64 x 128 x 64 tile. A correct fp32 kernel stays at a few units; one that rounds its operands
// to a narrower type lands in the hundreds (CI once saw attention outputs 100x off on a CPU we
// could not identify; this makes such a kernel lose the path instead of a test, or a run).
// Above this many units of the bound the micro-kernel does not serve (a correct fp32 kernel stays
// well under it: a k-term sum's worst case is about k units, and these errors are far from worst).
constexpr double kBrgemmTrialLimit = 8.0;

double brgemm_trial_error() {
  struct Shape {
    int64_t m, n, k, lda, ldb, ldc;
    bool accumulate;
  };
  const Shape shapes[] = {{16, 8, 8, 8, 37, 8, false}, {16, 8, 5, 5, 8, 24, true}, {5, 8, 8, 8, 8, 24, true},
                          {64, 128, 64, 64, 128, 128, false}, {64, 64, 128, 128, 64, 64, true}};
  uint32_t state = 12345;
  auto next = [&state] {  // deterministic values in [-1, 1)
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / static_cast<float>(1u << 23) - 1.0f;
  };
  double worst = 0.0;
  for (const Shape& s : shapes) {
    std::vector<float> a(s.m * s.lda), b(s.k * s.ldb), c(s.m * s.ldc);
    for (float& x : a) x = next();
    for (float& x : b) x = next();
    for (float& x : c) x = next();
    const std::vector<float> c0 = c;
    at::native::cpublas::brgemm(s.m, s.n, s.k, s.lda, s.ldb, s.ldc, s.accumulate, a.data(), b.data(), c.data(), false);
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t j = 0; j < s.n; ++j) {
        double exact = s.accumulate ? c0[i * s.ldc + j] : 0.0, magnitude = std::abs(exact);
        for (int64_t p = 0; p < s.k; ++p) {
          exact += static_cast<double>(a[i * s.lda + p]) * b[p * s.ldb + j];
          magnitude += std::abs(static_cast<double>(a[i * s.lda + p]) * b[p * s.ldb + j]);
        }
        const double bound = std::numeric_limits<float>::epsilon() * std::max(magnitude, 1e-30);
        worst = std::max(worst, std::abs(c[i * s.ldc + j] - exact) / bound);
      }
  }
  return worst;
}

CpuPathChoice decide_brgemm() {
  CpuPathChoice c{"brgemm", "attention's fp32 tile products", "MKL sgemm", "", false};
#ifdef CPUBLAS_BRGEMM_F32F32F32
  if (cpu_fallback_forced(c.path)) return c.why = "forced by STRATA_CPU_FALLBACK", c;
  double error = 0.0;
  try {
    error = brgemm_trial_error();
  } catch (const std::exception&) {
    return c.why = "oneDNN has no fp32 batch-reduce micro-kernel for this CPU", c;
  }
  char figure[64];
  std::snprintf(figure, sizeof figure, "%.1f", error);
  if (error > kBrgemmTrialLimit)
    return c.why = std::string("oneDNN's micro-kernel was inaccurate in a trial on attention's tile shapes (worst ") + figure + " units of fp32's rounding)", c;
  c.chosen = "oneDNN batch-reduce micro-kernel (cpublas::brgemm)", c.fast = true;
  c.why = std::string("a trial on attention's tile shapes stayed within fp32's rounding (worst ") + figure + " units)";
#else
  c.why = "this libtorch has no fp32 cpublas::brgemm";
#endif
  return c;
}

}  // namespace

bool brgemm_chosen() {
  static const bool chosen = decide_cpu_path(&decide_brgemm);
  return chosen;
}

void tile_gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, bool accumulate,
               float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
#ifdef CPUBLAS_BRGEMM_F32F32F32
  if (k > 0 && brgemm_chosen()) {
    at::native::cpublas::brgemm(m, n, k, lda, ldb, ldc, accumulate, a, b, c, false);
    return;
  }
#endif
  gemm(Trans::no, Trans::no, m, n, k, 1.0f, a, lda, b, ldb, accumulate ? 1.0f : 0.0f, c, ldc);
}

void tile_gemm(int64_t m, int64_t n, int64_t k, const double* a, int64_t lda, const double* b, int64_t ldb,
               bool accumulate, double* c, int64_t ldc) {
  gemm(Trans::no, Trans::no, m, n, k, 1.0, a, lda, b, ldb, accumulate ? 1.0 : 0.0, c, ldc);
}

SequentialBlas::SequentialBlas() {
  if (MKL_Set_Num_Threads_Local) previous_ = MKL_Set_Num_Threads_Local(1);
}

SequentialBlas::~SequentialBlas() {
  if (MKL_Set_Num_Threads_Local) MKL_Set_Num_Threads_Local(previous_);
}

}  // namespace strata::kernels
