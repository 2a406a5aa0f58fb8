// Fused cross entropy on a GPU (cross_entropy_kernels.h). ATen's CUDA loss runs log_softmax
// (one kernel, [N, V] log-probabilities written and kept for the backward), nll_loss, and in the
// backward nll_loss_backward (a zero-filled [N, V]) and log_softmax_backward (reads both). Here
// one block of 256 threads takes a row: pass 1 reads the row once for its running max and sum of
// exponentials (each thread keeps its own (max, sum), then a warp-shuffle and a shared-memory
// combine); pass 2 reads it again, from L2 at these row sizes, and writes the gradient (float, or
// rounded once to bf16/half for the chunked linear + cross-entropy's GEMMs). The per-row loss
// goes to row_loss; the caller sums and divides on the device.
#include "cross_entropy_kernels.h"

#include <cmath>
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "storage.cuh"

namespace strata::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;
constexpr int64_t kIgnoreIndex = -100;

struct MaxSum {
  float max, sum;  // sum of exp(z - max) over the values seen
};

// The (max, sum) of the union of two sets of values; -inf max means an empty (or all -inf) set.
__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.max, b.max);
  if (m == -INFINITY) return {m, 0.f};
  return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

// The row's (max, sum) from every thread's, returned to every thread. `shared` holds kThreads / 32.
__device__ MaxSum block_max_sum(MaxSum v, MaxSum* shared) {
  for (int offset = 16; offset > 0; offset /= 2)
    v = combine(v, {__shfl_down_sync(0xffffffffu, v.max, offset), __shfl_down_sync(0xffffffffu, v.sum, offset)});
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // shared may still be read for the previous row
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  MaxSum total{-INFINITY, 0.f};
  for (int w = 0; w < kThreads / 32; ++w) total = combine(total, shared[w]);
  return total;
}

// T: the logits' storage, G: the gradient's (float, or 16-bit for float or same-type logits).
template <class T, class G>
__global__ void forward_kernel(const T* logits, const int64_t* targets, G* grad, float* row_loss, int64_t rows, int64_t vocab,
                               int64_t ld) {
  __shared__ MaxSum shared[kThreads / 32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* z = logits + row * ld;
    G* g = grad ? grad + row * ld : nullptr;
    const int64_t t = targets[row];
    if (t == kIgnoreIndex) {
      if (g)
        for (int64_t j = threadIdx.x; j < ld; j += kThreads) g[j] = from_float<G>(0.f);
      if (threadIdx.x == 0) row_loss[row] = 0.f;
      continue;
    }
    if (t < 0 || t >= vocab) {
      if (g)
        for (int64_t j = threadIdx.x; j < ld; j += kThreads) g[j] = from_float<G>(NAN);
      if (threadIdx.x == 0) row_loss[row] = NAN;
      continue;
    }
    // Online: one exp per value, kUnroll independent loads per thread in flight (one at a time,
    // each waiting on the last, ran at a third of the memory's rate on an H200).
    MaxSum mine{-INFINITY, 0.f};
    for (int64_t base = threadIdx.x; base < vocab; base += kUnroll * kThreads) {
      float v[kUnroll];
      float m = -INFINITY;
      bool all_minus_infinity = true;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t j = base + u * kThreads;
        v[u] = j < vocab ? to_float(z[j]) : -INFINITY;
        m = fmaxf(m, v[u]);  // ignores NaN, which the sum below still takes in
        all_minus_infinity = all_minus_infinity && v[u] == -INFINITY;
      }
      if (all_minus_infinity) continue;  // adds nothing (and -inf - -inf would be NaN)
      if (m > mine.max) mine.sum *= expf(mine.max - m), mine.max = m;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) mine.sum += expf(v[u] - mine.max);  // exp(-inf) = 0 for the ends
    }
    const MaxSum all = block_max_sum(mine, shared);
    const float lse = all.max + logf(all.sum);
    if (threadIdx.x == 0) row_loss[row] = lse - to_float(z[t]);
    if (!g) continue;
    for (int64_t j = threadIdx.x; j < ld; j += kThreads)
      g[j] = from_float<G>(j < vocab ? expf(to_float(z[j]) - lse) - (j == t ? 1.f : 0.f) : 0.f);
  }
}

unsigned blocks_for(int64_t rows) { return static_cast<unsigned>(rows < 65536 ? (rows < 1 ? 1 : rows) : 65536); }

template <class T, class G>
void launch(const void* logits, const int64_t* targets, void* grad, float* row_loss, int64_t rows, int64_t vocab, int64_t ld,
            void* stream) {
  forward_kernel<T, G><<<blocks_for(rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const T*>(logits), targets, static_cast<G*>(grad), row_loss, rows, vocab, ld);
}

}  // namespace

int cross_entropy_forward(Storage logits_type, const void* logits, const int64_t* targets, Storage grad_type, void* grad,
                          float* row_loss, int64_t rows, int64_t vocab, int64_t ld, void* stream) {
  if (rows == 0 || vocab == 0) return 0;
  if (ld < vocab) return static_cast<int>(cudaErrorInvalidValue);
  if (grad_type == Storage::Float) {
    switch (logits_type) {
      case Storage::Float: launch<float, float>(logits, targets, grad, row_loss, rows, vocab, ld, stream); break;
      case Storage::BFloat16: launch<__nv_bfloat16, float>(logits, targets, grad, row_loss, rows, vocab, ld, stream); break;
      case Storage::Half: launch<__half, float>(logits, targets, grad, row_loss, rows, vocab, ld, stream); break;
    }
  } else if (logits_type == Storage::Float) {
    if (grad_type == Storage::BFloat16) launch<float, __nv_bfloat16>(logits, targets, grad, row_loss, rows, vocab, ld, stream);
    else launch<float, __half>(logits, targets, grad, row_loss, rows, vocab, ld, stream);
  } else if (logits_type == grad_type) {
    if (grad_type == Storage::BFloat16) launch<__nv_bfloat16, __nv_bfloat16>(logits, targets, grad, row_loss, rows, vocab, ld, stream);
    else launch<__half, __half>(logits, targets, grad, row_loss, rows, vocab, ld, stream);
  } else {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace strata::kernels::cuda
