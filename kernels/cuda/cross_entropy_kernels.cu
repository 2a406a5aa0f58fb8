// Fused cross entropy on a GPU (cross_entropy_kernels.h). ATen's CUDA loss runs log_softmax
// (one kernel, [N, V] log-probabilities written and kept for the backward), nll_loss, and in the
// backward nll_loss_backward (a zero-filled [N, V]) and log_softmax_backward (reads both). Here
// one block takes a row: pass 1 reads the row once for its running max and sum of exponentials
// (each thread keeps its own (max, sum), then a warp-shuffle and a shared-memory combine); pass 2
// reads it again, from L2, and writes the gradient (float, or rounded once to bf16/half for the
// chunked linear + cross-entropy's GEMMs). The per-row loss goes to row_loss; the caller sums and
// divides on the device.
//
// Two kernels do this. The wide one, for rows of 16-byte aligned vectors (the fused loss pads its
// vocabulary to a multiple of 64), loads and stores 16 bytes a thread at a time with 512 threads a
// row. Why, as read from an H200 profile of GPT-2's step (bench/results/profile_cuda_bf16.md; the
// wide kernel's own speed is not measured yet): the element-at-a-time kernel with 256 threads took
// 239 us for a chunk of 1170 rows of 50304 bf16 logits, 1.5 TB/s of the card's 4.8. Each of its
// threads has 8 bytes of loads in flight, few against the memory's latency; and its 1170 rows
// over 1056 resident blocks (8 a multiprocessor) run as a full wave and a tenth of another, which
// takes about as long as a full one. The wide kernel has 32 bytes a thread in flight, and at 64
// registers 2 blocks a multiprocessor: 264 rows at once (26 MB, within the 50 MB L2, where pass 2
// reads them back), so 1170 rows are 4.4 waves of shorter rows. The element-at-a-time kernel
// serves the other rows (a vocabulary of 50257 unpadded, odd pointers).
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

// The row's (max, sum) from every thread's, returned to every thread. `shared` holds kBlock / 32.
template <int kBlock>
__device__ MaxSum block_max_sum(MaxSum v, MaxSum* shared) {
  for (int offset = 16; offset > 0; offset /= 2)
    v = combine(v, {__shfl_down_sync(0xffffffffu, v.max, offset), __shfl_down_sync(0xffffffffu, v.sum, offset)});
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // shared may still be read for the previous row
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  MaxSum total{-INFINITY, 0.f};
  for (int w = 0; w < kBlock / 32; ++w) total = combine(total, shared[w]);
  return total;
}

// Takes N more values into a thread's running (max, sum): one exp per value. -inf values (the
// row's ends) add nothing; a NaN makes the sum NaN.
template <int N>
__device__ __forceinline__ void fold(MaxSum& mine, const float (&v)[N]) {
  float m = -INFINITY;
  bool all_minus_infinity = true;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    m = fmaxf(m, v[i]);  // ignores NaN, which the sum below still takes in
    all_minus_infinity = all_minus_infinity && v[i] == -INFINITY;
  }
  if (all_minus_infinity) return;  // adds nothing (and -inf - -inf would be NaN)
  if (m > mine.max) mine.sum *= expf(mine.max - m), mine.max = m;
#pragma unroll
  for (int i = 0; i < N; ++i) mine.sum += expf(v[i] - mine.max);  // exp(-inf) = 0
}

// A row whose target is -100 (loss 0, gradient 0) or out of range (NaN, the kernel cannot raise)
// is written here, by all `block` threads, and true returned; false for a counted row.
template <class G>
__device__ bool counted_row_or_fill(int64_t t, int64_t vocab, G* g, float* loss, int64_t ld, int block) {
  if (t >= 0 && t < vocab) return false;
  const float fill = t == kIgnoreIndex ? 0.f : NAN;
  if (g)
    for (int64_t j = threadIdx.x; j < ld; j += block) g[j] = from_float<G>(fill);
  if (threadIdx.x == 0) *loss = fill;
  return true;
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
    if (counted_row_or_fill(t, vocab, g, row_loss + row, ld, kThreads)) continue;
    // Online: one exp per value, kUnroll independent loads per thread in flight (one at a time,
    // each waiting on the last, ran at a third of the memory's rate on an H200).
    MaxSum mine{-INFINITY, 0.f};
    for (int64_t base = threadIdx.x; base < vocab; base += kUnroll * kThreads) {
      float v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t j = base + u * kThreads;
        v[u] = j < vocab ? to_float(z[j]) : -INFINITY;
      }
      fold(mine, v);
    }
    const MaxSum all = block_max_sum<kThreads>(mine, shared);
    const float lse = all.max + logf(all.sum);
    if (threadIdx.x == 0) row_loss[row] = lse - to_float(z[t]);
    if (!g) continue;
    for (int64_t j = threadIdx.x; j < ld; j += kThreads)
      g[j] = from_float<G>(j < vocab ? expf(to_float(z[j]) - lse) - (j == t ? 1.f : 0.f) : 0.f);
  }
}

// The wide kernel: W values of T in one 16-byte access (ATen's aligned_vector likewise).
constexpr int kWideThreads = 512;
constexpr int kWideUnroll = 2;  // 16-byte loads in flight per thread

template <class T, int W>
struct alignas(sizeof(T) * W) Pack {
  T v[W];
};

// As forward_kernel, for rows whose ld is a multiple of W = 16 / sizeof(T), logits 16-byte and
// grad W-values aligned. The padding columns [vocab, ld) are loaded with their pack but not used.
template <class T, class G>
__global__ void __launch_bounds__(kWideThreads)
    wide_forward_kernel(const T* __restrict__ logits, const int64_t* __restrict__ targets, G* __restrict__ grad,
                        float* __restrict__ row_loss, int64_t rows, int64_t vocab, int64_t ld) {
  constexpr int W = 16 / sizeof(T);
  using In = Pack<T, W>;
  using Out = Pack<G, W>;
  __shared__ MaxSum shared[kWideThreads / 32];
  const int64_t packs = ld / W;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const In* z = reinterpret_cast<const In*>(logits + row * ld);
    G* g_row = grad ? grad + row * ld : nullptr;
    const int64_t t = targets[row];
    if (counted_row_or_fill(t, vocab, g_row, row_loss + row, ld, kWideThreads)) continue;
    MaxSum mine{-INFINITY, 0.f};
    for (int64_t base = threadIdx.x; base < packs; base += kWideUnroll * kWideThreads) {
      In in[kWideUnroll];
#pragma unroll
      for (int u = 0; u < kWideUnroll; ++u)
        if (base + u * kWideThreads < packs) in[u] = z[base + u * kWideThreads];
      float v[kWideUnroll * W];
#pragma unroll
      for (int u = 0; u < kWideUnroll; ++u)
#pragma unroll
        for (int k = 0; k < W; ++k) {
          const int64_t j = (base + u * kWideThreads) * W + k;  // >= vocab for packs past the row, not loaded
          v[u * W + k] = j < vocab ? to_float(in[u].v[k]) : -INFINITY;
        }
      fold(mine, v);
    }
    const MaxSum all = block_max_sum<kWideThreads>(mine, shared);
    const float lse = all.max + logf(all.sum);
    if (threadIdx.x == 0) row_loss[row] = lse - to_float(logits[row * ld + t]);
    if (!g_row) continue;
    Out* g = reinterpret_cast<Out*>(g_row);
    for (int64_t base = threadIdx.x; base < packs; base += kWideUnroll * kWideThreads) {
      In in[kWideUnroll];
#pragma unroll
      for (int u = 0; u < kWideUnroll; ++u)
        if (base + u * kWideThreads < packs) in[u] = z[base + u * kWideThreads];
#pragma unroll
      for (int u = 0; u < kWideUnroll; ++u) {
        const int64_t p = base + u * kWideThreads;
        if (p >= packs) continue;
        Out out;
#pragma unroll
        for (int k = 0; k < W; ++k) {
          const int64_t j = p * W + k;
          out.v[k] = from_float<G>(j < vocab ? expf(to_float(in[u].v[k]) - lse) - (j == t ? 1.f : 0.f) : 0.f);
        }
        g[p] = out;
      }
    }
  }
}

unsigned blocks_for(int64_t rows) { return static_cast<unsigned>(rows < 65536 ? (rows < 1 ? 1 : rows) : 65536); }

bool aligned_to(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

template <class T, class G>
void launch(const void* logits, const int64_t* targets, void* grad, float* row_loss, int64_t rows, int64_t vocab, int64_t ld,
            void* stream) {
  constexpr int W = 16 / sizeof(T);
  const bool wide = ld % W == 0 && aligned_to(logits, 16) && (!grad || aligned_to(grad, W * sizeof(G)));
  const auto* z = static_cast<const T*>(logits);
  auto* g = static_cast<G*>(grad);
  if (wide)
    wide_forward_kernel<T, G><<<blocks_for(rows), kWideThreads, 0, static_cast<cudaStream_t>(stream)>>>(z, targets, g, row_loss, rows,
                                                                                                        vocab, ld);
  else
    forward_kernel<T, G><<<blocks_for(rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(z, targets, g, row_loss, rows, vocab, ld);
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
