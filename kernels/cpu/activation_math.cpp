// The arithmetic of activation_math.h, compiled once per CPU capability: STRATA_CPU_NAMESPACE
// names the copy (generic, avx2) and the build sets ATen's CPU_CAPABILITY macros and compiler
// flags to match (kernels/CMakeLists.txt). Exp is at::vec's exp_u20 (a polynomial, 20 ulp at
// most, what ATen's CPU flash attention uses) on an argument clamped to +-88, where it and the
// float range end. A tail shorter than a vector goes through a zero-padded buffer, so every
// element takes the same arithmetic.
#include <algorithm>
#include <array>
#include <cstring>

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include "activation_math.h"

#ifndef STRATA_CPU_NAMESPACE
#error "compile activation_math.cpp with STRATA_CPU_NAMESPACE set (kernels/CMakeLists.txt)"
#endif

namespace strata::kernels::STRATA_CPU_NAMESPACE {
namespace {

using Vec = at::vec::Vectorized<float>;

// Loads and stores float vectors from storage T: one vector per step for float, two for the
// 16-bit types (whose vector holds twice as many elements).
template <class T>
struct Lanes {
  static constexpr int64_t kStep = at::vec::Vectorized<T>::size();
  static constexpr int kParts = 2;
  static void load(const T* p, Vec* v) { std::tie(v[0], v[1]) = at::vec::convert_to_float<T>(at::vec::Vectorized<T>::loadu(p)); }
  static void store(T* p, const Vec* v) { at::vec::convert_from_float<T>(v[0], v[1]).store(p); }
};
template <>
struct Lanes<float> {
  static constexpr int64_t kStep = Vec::size();
  static constexpr int kParts = 1;
  static void load(const float* p, Vec* v) { v[0] = Vec::loadu(p); }
  static void store(float* p, const Vec* v) { v[0].store(p); }
};

// out[o][j] = f(in[.][j])[o] for j < n; f maps In float vectors to Out.
template <class T, size_t In, size_t Out, class F>
void map(std::array<const T*, In> in, std::array<T*, Out> out, int64_t n, F f) {
  using L = Lanes<T>;
  auto apply = [&](const std::array<const T*, In>& src, const std::array<T*, Out>& dst, int64_t at) {
    Vec args[In][L::kParts], results[Out][L::kParts];
    for (size_t i = 0; i < In; ++i) L::load(src[i] + at, args[i]);
    for (int part = 0; part < L::kParts; ++part) {
      std::array<Vec, In> a;
      for (size_t i = 0; i < In; ++i) a[i] = args[i][part];
      const std::array<Vec, Out> r = f(a);
      for (size_t o = 0; o < Out; ++o) results[o][part] = r[o];
    }
    for (size_t o = 0; o < Out; ++o) L::store(dst[o] + at, results[o]);
  };
  int64_t j = 0;
  for (; j + L::kStep <= n; j += L::kStep) apply(in, out, j);
  if (j == n) return;
  const int64_t rest = n - j;
  T in_pad[In][L::kStep], out_pad[Out][L::kStep];
  std::array<const T*, In> src;
  std::array<T*, Out> dst;
  for (size_t i = 0; i < In; ++i) {
    std::fill(in_pad[i], in_pad[i] + L::kStep, T(0));
    std::memcpy(in_pad[i], in[i] + j, rest * sizeof(T));
    src[i] = in_pad[i];
  }
  for (size_t o = 0; o < Out; ++o) dst[o] = out_pad[o];
  apply(src, dst, 0);
  for (size_t o = 0; o < Out; ++o) std::memcpy(out[o] + j, out_pad[o], rest * sizeof(T));
}

// 1 / (1 + exp(-z)).
Vec sigmoid(const Vec& z) {
  const Vec one(1.0f), limit(88.0f);
  return one / (one + at::vec::clamp(-z, -limit, limit).exp_u20());
}

constexpr float kSqrt2OverPi = 0.7978845608028654f, kCubic = 0.044715f;

template <class T>
void gelu_tanh_forward(const T* x, T* y, int64_t n) {
  map<T, 1, 1>({x}, {y}, n, [](const std::array<Vec, 1>& a) {
    const Vec& v = a[0];
    const Vec two_u = v * (Vec(2 * kSqrt2OverPi) + Vec(2 * kSqrt2OverPi * kCubic) * v * v);
    return std::array<Vec, 1>{v * sigmoid(two_u)};
  });
}

template <class T>
void gelu_tanh_backward(const T* x, const T* dy, T* dx, int64_t n) {
  map<T, 2, 1>({x, dy}, {dx}, n, [](const std::array<Vec, 2>& a) {
    const Vec &v = a[0], v2 = v * v;
    const Vec s = sigmoid(v * (Vec(2 * kSqrt2OverPi) + Vec(2 * kSqrt2OverPi * kCubic) * v2));
    const Vec two_du = Vec(2 * kSqrt2OverPi) + Vec(2 * 3 * kSqrt2OverPi * kCubic) * v2;  // 2 u'(x)
    return std::array<Vec, 1>{a[1] * (s + v * s * (Vec(1.0f) - s) * two_du)};
  });
}

template <class T>
void swiglu_forward(const T* gate, const T* up, T* y, int64_t n) {
  map<T, 2, 1>({gate, up}, {y}, n, [](const std::array<Vec, 2>& a) { return std::array<Vec, 1>{a[0] * sigmoid(a[0]) * a[1]}; });
}

template <class T>
void swiglu_backward(const T* gate, const T* up, const T* dy, T* dgate, T* dup, int64_t n) {
  map<T, 3, 2>({gate, up, dy}, {dgate, dup}, n, [](const std::array<Vec, 3>& a) {
    const Vec &g = a[0], &u = a[1], &d = a[2], s = sigmoid(g);
    return std::array<Vec, 2>{d * u * s * (Vec(1.0f) + g * (Vec(1.0f) - s)), d * g * s};
  });
}

template <class T>
const ActivationOps<T>& ops_for() {
  static const ActivationOps<T> ops{&gelu_tanh_forward<T>, &gelu_tanh_backward<T>, &swiglu_forward<T>, &swiglu_backward<T>};
  return ops;
}

}  // namespace

const ActivationOps<float>& activation_ops_float() { return ops_for<float>(); }
const ActivationOps<c10::BFloat16>& activation_ops_bf16() { return ops_for<c10::BFloat16>(); }
const ActivationOps<c10::Half>& activation_ops_half() { return ops_for<c10::Half>(); }

}  // namespace strata::kernels::STRATA_CPU_NAMESPACE
