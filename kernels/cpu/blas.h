// Row-major GEMM on raw pointers through the BLAS that libtorch carries (its exported Fortran
// sgemm_/dgemm_), for kernels whose tiles are too small for at::mm's per-call cost: C = alpha
// op(A) op(B) + beta C with C [m, n], op(A) [m, k], op(B) [k, n], each with its row stride.
#pragma once

#include <cstdint>

namespace strata::kernels {

enum class Trans : char { no = 'N', yes = 'T' };

void gemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
          int64_t ldb, float beta, float* c, int64_t ldc);
void gemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda, const double* b,
          int64_t ldb, double beta, double* c, int64_t ldc);

// C [m, n] = A [m, k] B [k, n], plus C when `accumulate`: row-major, neither operand transposed,
// no alpha; one thread. For fp32 this is oneDNN's batch-reduce GEMM micro-kernel (ATen's
// cpublas::brgemm), which on attention's 64 x 128 x 64 tiles ran 112-115 GFLOP/s on one Zen 4
// core where MKL's sgemm ran 88-95 (its per-call packing dominates at that size). Where libtorch
// has no such kernel for this CPU or its result misses fp32's rounding bound on attention's tile
// shapes (decided once, by a trial against the product in double: brgemm_chosen), under
// STRATA_CPU_FALLBACK=brgemm, and for fp64 it is gemm.
void tile_gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, bool accumulate,
               float* c, int64_t ldc);
void tile_gemm(int64_t m, int64_t n, int64_t k, const double* a, int64_t lda, const double* b, int64_t ldb, bool accumulate,
               double* c, int64_t ldc);

// Whether oneDNN's fp32 micro-kernel serves tile_gemm here (recorded, strata/cpu.h).
bool brgemm_chosen();

// Inside at::parallel_for: makes this thread's BLAS calls single-threaded while it lives. ATen
// sets MKL to as many threads as itself with dynamic adjustment off, so an MKL call inside a
// parallel region would open a nested OpenMP region for every tile (measured: under
// OMP_WAIT_POLICY=passive that made the 2-thread attention kernel twice as slow as 1 thread).
// MKL's thread-local setting where libtorch carries MKL, nothing otherwise.
class SequentialBlas {
 public:
  SequentialBlas();
  ~SequentialBlas();
  SequentialBlas(const SequentialBlas&) = delete;
  SequentialBlas& operator=(const SequentialBlas&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace strata::kernels
