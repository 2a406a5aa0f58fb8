// The error measure of the kernel tests: the largest elementwise |a - b| / max(1, |b|) in fp64,
// relative for values above 1 and absolute near zero (b: the reference or the exact value).
#pragma once

#include <ATen/ATen.h>

namespace strata::testing {

inline double max_elementwise_error(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  return ((x - y).abs() / y.abs().clamp_min(1.0)).max().item<double>();
}

}  // namespace strata::testing
