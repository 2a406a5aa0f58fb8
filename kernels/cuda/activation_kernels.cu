// The fused activations on a GPU (activation_kernels.h). Elementwise, so memory-bound: each kernel
// reads its inputs once and writes its outputs once (the references compose ATen kernels: SwiGLU's
// forward is a silu kernel and a product through a temporary, its backward several kernels; GELU's
// are one kernel each way, which these match). One templated grid-stride kernel serves all four:
// each thread moves 16 bytes of every input and output per iteration (8 bf16/half or 4 floats,
// as ATen's vectorised elementwise kernels do) where every pointer is 16-byte aligned, else one
// element at a time; arithmetic in float.
//
//   gelu(x)   = x s,   s = sigmoid(2u),  u = k (x + c x^3), k = sqrt(2/pi), c = 0.044715
//   gelu'(x)  = s + 2 x s (1 - s) k (1 + 3 c x^2)
//   swiglu(g, u) = g s u,  s = sigmoid(g);   d/dg = dy u s (1 + g (1 - s)),  d/du = dy g s
#include "activation_kernels.h"

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "storage.cuh"

namespace strata::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 16;
constexpr float kK = 0.7978845608028654f, kC = 0.044715f;

__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

struct GeluForward {
  static constexpr int kIn = 1, kOut = 1;
  __device__ void operator()(const float* in, float* out) const {
    const float x = in[0];
    out[0] = x * sigmoid(2.0f * kK * (x + kC * x * x * x));
  }
};
struct GeluBackward {
  static constexpr int kIn = 2, kOut = 1;  // x, dy -> dx
  __device__ void operator()(const float* in, float* out) const {
    const float x = in[0], s = sigmoid(2.0f * kK * (x + kC * x * x * x));
    out[0] = in[1] * (s + 2.0f * x * s * (1.0f - s) * kK * (1.0f + 3.0f * kC * x * x));
  }
};
struct SwigluForward {
  static constexpr int kIn = 2, kOut = 1;  // gate, up -> y
  __device__ void operator()(const float* in, float* out) const { out[0] = in[0] * sigmoid(in[0]) * in[1]; }
};
struct SwigluBackward {
  static constexpr int kIn = 3, kOut = 2;  // gate, up, dy -> dgate, dup
  __device__ void operator()(const float* in, float* out) const {
    const float g = in[0], u = in[1], d = in[2], s = sigmoid(g);
    out[0] = d * u * s * (1.0f + g * (1.0f - s));
    out[1] = d * g * s;
  }
};

template <class T, int N>
struct Pointers {
  T* p[N];
};

template <class T, class Op>
__global__ void elementwise(Pointers<const T, Op::kIn> in, Pointers<T, Op::kOut> out, int64_t n, bool vectorised) {
  const Op op;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  float x[Op::kIn], y[Op::kOut];
  int64_t scalar_from = 0;
  if (vectorised) {
    constexpr int kVec = 16 / sizeof(T);
    struct alignas(16) Pack {
      T v[kVec];
    };
    const int64_t packs = n / kVec;
    for (int64_t p = first; p < packs; p += stride) {
      Pack a[Op::kIn], b[Op::kOut];
      for (int k = 0; k < Op::kIn; ++k) a[k] = reinterpret_cast<const Pack*>(in.p[k])[p];
      for (int e = 0; e < kVec; ++e) {
        for (int k = 0; k < Op::kIn; ++k) x[k] = to_float(a[k].v[e]);
        op(x, y);
        for (int k = 0; k < Op::kOut; ++k) b[k].v[e] = from_float<T>(y[k]);
      }
      for (int k = 0; k < Op::kOut; ++k) reinterpret_cast<Pack*>(out.p[k])[p] = b[k];
    }
    scalar_from = packs * kVec;
  }
  for (int64_t i = scalar_from + first; i < n; i += stride) {
    for (int k = 0; k < Op::kIn; ++k) x[k] = to_float(in.p[k][i]);
    op(x, y);
    for (int k = 0; k < Op::kOut; ++k) out.p[k][i] = from_float<T>(y[k]);
  }
}

// Launches Op over n elements of storage `type`; returns cudaGetLastError().
template <class Op>
int launch(Storage type, const void* const* in, void* const* out, int64_t n, void* stream) {
  if (n == 0) return 0;
  auto run = [&](auto* type_tag) {
    using T = std::remove_pointer_t<decltype(type_tag)>;
    Pointers<const T, Op::kIn> ins;
    Pointers<T, Op::kOut> outs;
    bool aligned = true;
    for (int k = 0; k < Op::kIn; ++k) ins.p[k] = static_cast<const T*>(in[k]), aligned &= reinterpret_cast<uintptr_t>(in[k]) % 16 == 0;
    for (int k = 0; k < Op::kOut; ++k) outs.p[k] = static_cast<T*>(out[k]), aligned &= reinterpret_cast<uintptr_t>(out[k]) % 16 == 0;
    const int64_t per_thread = aligned ? 16 / static_cast<int64_t>(sizeof(T)) : 1;
    int64_t blocks = (n + per_thread * kThreads - 1) / (per_thread * kThreads);
    // 65536 blocks of 256 threads keep any GPU full; beyond, each thread loops (2^27 bf16 elements).
    blocks = blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks);
    elementwise<T, Op><<<static_cast<unsigned>(blocks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(ins, outs, n, aligned);
  };
  switch (type) {
    case Storage::Float: run(static_cast<float*>(nullptr)); break;
    case Storage::BFloat16: run(static_cast<__nv_bfloat16*>(nullptr)); break;
    case Storage::Half: run(static_cast<__half*>(nullptr)); break;
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int gelu_tanh_forward(Storage type, const void* x, void* y, int64_t n, void* stream) {
  const void* in[] = {x};
  void* out[] = {y};
  return launch<GeluForward>(type, in, out, n, stream);
}

int gelu_tanh_backward(Storage type, const void* x, const void* dy, void* dx, int64_t n, void* stream) {
  const void* in[] = {x, dy};
  void* out[] = {dx};
  return launch<GeluBackward>(type, in, out, n, stream);
}

int swiglu_forward(Storage type, const void* gate, const void* up, void* y, int64_t n, void* stream) {
  const void* in[] = {gate, up};
  void* out[] = {y};
  return launch<SwigluForward>(type, in, out, n, stream);
}

int swiglu_backward(Storage type, const void* gate, const void* up, const void* dy, void* dgate, void* dup, int64_t n,
                    void* stream) {
  const void* in[] = {gate, up, dy};
  void* out[] = {dgate, dup};
  return launch<SwigluBackward>(type, in, out, n, stream);
}

}  // namespace strata::kernels::cuda
