// Row-major GEMM (blas.h) as a column-major BLAS call: a row-major X is the column-major X^T
// with the same leading dimension, so C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T, the
// operands swapped and their transpose flags kept.
#include "blas.h"

#include <exception>
#include <stdexcept>

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

CpuPathChoice decide_brgemm() {
  CpuPathChoice c{"brgemm", "attention's fp32 tile products", "MKL sgemm", "", false};
#ifdef CPUBLAS_BRGEMM_F32F32F32
  if (cpu_fallback_forced(c.path)) return c.why = "forced by STRATA_CPU_FALLBACK", c;
  try {
    const float a = 3.0f, b = 2.0f;
    float out = 0.0f;
    at::native::cpublas::brgemm(1, 1, 1, 1, 1, 1, false, &a, &b, &out, false);
    if (out != 6.0f) return c.why = "oneDNN's micro-kernel gave a wrong result in a trial call", c;
  } catch (const std::exception&) {
    return c.why = "oneDNN has no fp32 batch-reduce micro-kernel for this CPU", c;
  }
  c.chosen = "oneDNN batch-reduce micro-kernel (cpublas::brgemm)", c.fast = true;
  c.why = "a trial call ran";
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
