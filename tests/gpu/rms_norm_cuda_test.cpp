// rms_norm.fused_cuda (kernels/cuda/rms_norm_kernels.cu) on a GPU against core's
// rms_norm.reference on the same GPU: output, dx and dweight for rows 1 to 3000 (more rows than
// the backward's row groups), widths that do and do not fill a block (1, 7, 256, 1000, 4096),
// fp32, bf16 and half with a weight of x's dtype, bf16 x with an fp32 weight (the output then
// fp32, as the reference promotes), a scaled incoming gradient; and a weight dtype the kernel
// does not take, served by the reference. Skips without a CUDA device (or a build without nvcc).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "cuda/rms_norm_cuda.h"
#include "strata/core/operator_table.h"
#include "../elementwise_error.h"

namespace strata {
namespace {

#ifdef STRATA_HAVE_CUDA_KERNELS

using testing::max_elementwise_error;

struct Result {
  at::Tensor y, dx, dw;
};

template <class Fn>
Result run(Fn fn, const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& dy) {
  at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
  at::Tensor y = fn(x, w, 1e-6);
  const auto grads = torch::autograd::grad({y}, {x, w}, {dy.to(y.scalar_type())});
  return {y.detach(), grads[0], grads[1]};
}

const ops::OperatorImpl<ops::RmsNorm>& reference() {
  OperatorTable::global().reset();
  return static_cast<const ops::OperatorImpl<ops::RmsNorm>&>(*OperatorTable::global().implementations("rms_norm").back());
}

TEST(RmsNormCuda, MatchesTheReference) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const auto& ref = reference();
  ASSERT_EQ(ref.name(), "rms_norm.reference");
  struct Types {
    at::ScalarType x, w;
    double tol;  // fp32: summation order; 16-bit: a unit in the last place of the roundings
  };
  for (const Types types : {Types{at::kFloat, at::kFloat, 2e-5}, Types{at::kBFloat16, at::kBFloat16, 2e-2},
                            Types{at::kHalf, at::kHalf, 3e-3}, Types{at::kBFloat16, at::kFloat, 2e-2}})
    for (const auto [rows, dim] : {std::pair<int64_t, int64_t>{1, 1}, {7, 7}, {33, 256}, {3000, 1000}, {64, 4096}}) {
      SCOPED_TRACE(std::string(c10::toString(types.x)) + " x, " + c10::toString(types.w) + " weight, " + std::to_string(rows) + " x " +
                   std::to_string(dim));
      at::manual_seed(rows + dim);
      const auto cuda = at::TensorOptions().device(at::kCUDA);
      const at::Tensor x = (at::randn({rows, dim}, cuda) * 2 + 0.5).to(types.x);
      const at::Tensor w = (at::rand({dim}, cuda) + 0.5).to(types.w);
      const at::Tensor dy = at::randn({rows, dim}, cuda) * 3;
      const Result ours = run(kernels::rms_norm_fused_cuda, x, w, dy), theirs = run(ref.fn(), x, w, dy);
      EXPECT_EQ(ours.y.scalar_type(), theirs.y.scalar_type());
      EXPECT_EQ(ours.dx.scalar_type(), types.x);
      EXPECT_EQ(ours.dw.scalar_type(), types.w);
      EXPECT_LE(max_elementwise_error(ours.y, theirs.y), types.tol) << "y";
      EXPECT_LE(max_elementwise_error(ours.dx, theirs.dx), 2 * types.tol) << "dx";
      // dw sums rows products: relative to its largest entry.
      const double dw_scale = std::max(1.0, theirs.dw.abs().max().to(at::kDouble).item<double>());
      EXPECT_LE((ours.dw.to(at::kDouble) - theirs.dw.to(at::kDouble)).abs().max().item<double>() / dw_scale, 2 * types.tol) << "dw";
    }
}

TEST(RmsNormCuda, ThreeDimensionalInputAndAWeightItDoesNotTake) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const auto& ref = reference();
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  const at::Tensor x = at::randn({2, 5, 64}, cuda), w = at::rand({64}, cuda) + 0.5, dy = at::randn({2, 5, 64}, cuda);
  const Result ours = run(kernels::rms_norm_fused_cuda, x, w, dy), theirs = run(ref.fn(), x, w, dy);
  EXPECT_EQ(ours.y.sizes(), theirs.y.sizes());
  EXPECT_LE(max_elementwise_error(ours.y, theirs.y), 2e-5);
  EXPECT_LE(max_elementwise_error(ours.dx, theirs.dx), 4e-5);
  EXPECT_LE(max_elementwise_error(ours.dw, theirs.dw), 4e-5);
  // fp32 x with a bf16 weight: the reference serves it, so the results are the reference's.
  const Result mixed = run(kernels::rms_norm_fused_cuda, x, w.to(at::kBFloat16), dy), mixed_ref = run(ref.fn(), x, w.to(at::kBFloat16), dy);
  EXPECT_EQ(max_elementwise_error(mixed.y, mixed_ref.y), 0.0);
}

#else
TEST(RmsNormCuda, BuiltWithoutNvcc) { GTEST_SKIP() << "this build has no CUDA kernels (nvcc not found)"; }
#endif

}  // namespace
}  // namespace strata
