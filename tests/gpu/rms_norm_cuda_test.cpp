// rms_norm.fused_cuda (kernels/cuda/rms_norm_kernels.cu) on a GPU against core's
// rms_norm.reference on the same GPU (tests/rms_norm_cases.h): rows 1 to 3000 (more rows than the
// backward's row groups), widths that do and do not fill a block (1, 7, 256, 1000, 4096); a 3-D
// input and a weight dtype the kernel does not take (served by the reference);
// rms_norm.autocast_out_cuda's 16-bit output and dy against the fp32 kernel's. Skips without a
// CUDA device (or a build without nvcc).
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "cuda/rms_norm_cuda.h"
#include "../rms_norm_cases.h"
#include "autocast_scope.h"

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

// rms_norm.autocast_out_cuda: under autocast, fp32 x and weight, the fp32 kernel's output rounded
// to bf16 or fp16 once, and from a 16-bit dy the gradients the fp32 kernel gives from the same
// values in fp32: bit for bit, as the cast after the norm and its backward gave them.
TEST(RmsNormCuda, AutocastOutputIsTheCastOfTheFp32Output) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const auto on = at::TensorOptions().device(at::kCUDA);
  for (const at::ScalarType half : {at::kBFloat16, at::kHalf})
    for (const auto& [rows, dim] : {std::pair<int64_t, int64_t>{8192, 2048}, {33, 256}, {5, 7}}) {
      SCOPED_TRACE(std::string(c10::toString(half)) + " " + std::to_string(rows) + " x " + std::to_string(dim));
      at::manual_seed(rows + dim);
      const at::Tensor x = at::randn({rows, dim}, on) * 2, w = at::rand({dim}, on) + 0.5;
      const at::Tensor dy = (at::randn({rows, dim}, on) * 3).to(half);
      testing::RmsNormResult ours;
      {
        const testing::CudaAutocast autocast(half);
        ours = testing::run_rms_norm(kernels::rms_norm_autocast_out_cuda, x, w, dy);
      }
      const testing::RmsNormResult fp32 = testing::run_rms_norm(kernels::rms_norm_fused_cuda, x, w, dy.to(at::kFloat));
      EXPECT_EQ(ours.y.scalar_type(), half);
      EXPECT_TRUE(at::equal(ours.y, fp32.y.to(half))) << "y";
      EXPECT_TRUE(at::equal(ours.dx, fp32.dx)) << "dx";
      EXPECT_TRUE(at::equal(ours.dw, fp32.dw)) << "dw";
    }
}

#else
TEST(RmsNormCuda, BuiltWithoutNvcc) { GTEST_SKIP() << "this build has no CUDA kernels (nvcc not found)"; }
#endif

}  // namespace
}  // namespace strata
