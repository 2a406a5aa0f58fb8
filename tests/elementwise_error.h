// The error measures of the kernel tests, in fp64 (b: the reference or the exact value).
#pragma once

#include <ATen/ATen.h>

namespace strata::testing {

// The largest elementwise |a - b| / max(1, |b|): relative for values above 1, absolute near zero.
inline double max_elementwise_error(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  return ((x - y).abs() / y.abs().clamp_min(1.0)).max().item<double>();
}

// The largest |a - b| over the largest |b|: for GEMMs and reductions, whose errors scale with the
// result's magnitude rather than each element's.
inline double scaled_error(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  return ((x - y).abs().max() / y.abs().max().clamp_min(1e-30)).item<double>();
}

}  // namespace strata::testing
