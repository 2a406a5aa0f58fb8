// The kernel tests' bit-for-bit check: two tensors both undefined, or of one dtype with equal
// values; a failure names `what` and the largest difference.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace strata::testing {

inline void expect_bitwise_equal(const at::Tensor& a, const at::Tensor& b, const char* what) {
  ASSERT_EQ(a.defined(), b.defined()) << what;
  if (!a.defined()) return;
  EXPECT_EQ(a.scalar_type(), b.scalar_type()) << what;
  EXPECT_TRUE(at::equal(a, b)) << what << ": largest difference " << (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

}  // namespace strata::testing
