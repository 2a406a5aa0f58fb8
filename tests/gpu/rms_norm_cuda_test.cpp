// rms_norm.fused_cuda (kernels/cuda/rms_norm_kernels.cu) on a GPU against core's
// rms_norm.reference on the same GPU (tests/rms_norm_cases.h): rows 1 to 3000 (more rows than the
// backward's row groups), widths that do and do not fill a block (1, 7, 256, 1000, 4096); a 3-D
// input and a weight dtype the kernel does not take (served by the reference). Skips without a
// CUDA device (or a build without nvcc).
#include <gtest/gtest.h>

#include "cuda/rms_norm_cuda.h"
#include "../rms_norm_cases.h"

namespace strata {
namespace {

#ifdef STRATA_HAVE_CUDA_KERNELS

TEST(RmsNormCuda, MatchesTheReference) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  testing::expect_rms_norm_matches_reference(kernels::rms_norm_fused_cuda, at::kCUDA, {{1, 1}, {7, 7}, {33, 256}, {3000, 1000}, {64, 4096}});
}

TEST(RmsNormCuda, ThreeDimensionalInputAndAWeightItDoesNotTake) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  testing::expect_rms_norm_3d_and_fallback(kernels::rms_norm_fused_cuda, at::kCUDA);
}

#else
TEST(RmsNormCuda, BuiltWithoutNvcc) { GTEST_SKIP() << "this build has no CUDA kernels (nvcc not found)"; }
#endif

}  // namespace
}  // namespace strata
