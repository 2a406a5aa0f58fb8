// linear.cublaslt_cuda (kernels/cuda/linear_cublaslt_cuda.h) on a GPU against at::linear and the
// fp64 formulas on the same 16-bit values: the forward and the input gradient bit for bit (the
// same ATen calls), the weight and bias gradients of the cuBLASLt epilogue GEMM within a few
// 16-bit roundings of the exact sums; bf16 and fp16, GPT-2's shapes (where cuBLASLt must offer an
// algorithm, else nothing is measured) and odd ones, 3-D inputs, under autocast with fp32 master
// weights, and the calls it hands to at::linear (no bias, fp32). Skips without a CUDA device.
#include <string>
#include <tuple>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "../elementwise_error.h"
#include "autocast_scope.h"

#ifdef STRATA_HAVE_CUDA_KERNELS
#include "cuda/cublaslt_weight_gradient.h"
#include "cuda/linear_cublaslt_cuda.h"
#endif

namespace strata {
namespace {

#ifdef STRATA_HAVE_CUDA_KERNELS

struct Result {
  at::Tensor y, dx, dw, db;
};

template <class Fn>
Result run(Fn fn, const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& b0, const at::Tensor& dy) {
  at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
  std::optional<at::Tensor> b;
  if (b0.defined()) b = b0.clone().requires_grad_(true);
  const at::Tensor y = fn(x, w, b);
  std::vector<at::Tensor> inputs{x, w};
  if (b) inputs.push_back(*b);
  const auto grads = torch::autograd::grad({y}, inputs, {dy.to(y.scalar_type())});
  return {y.detach(), grads[0], grads[1], b ? grads[2] : at::Tensor()};
}

at::Tensor reference_linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b) { return at::linear(x, w, b); }

TEST(LinearCublasLtCuda, WeightAndBiasGradientsMatchTheExactSums) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const auto on = at::TensorOptions().device(at::kCUDA);
  for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf})
    for (const auto& [rows, in, out] : {std::tuple<int64_t, int64_t, int64_t>{8192, 768, 2304}, {8192, 768, 768}, {8192, 3072, 768},
                                        {8192, 768, 3072}, {64, 128, 256}, {33, 100, 50}, {1, 8, 8}}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " " + std::to_string(rows) + " x " + std::to_string(in) + " -> " + std::to_string(out));
      at::manual_seed(rows + in + out);
      const at::Tensor x = at::randn({rows, in}, on).to(dtype), w = (at::randn({out, in}, on) * 0.05).to(dtype);
      const at::Tensor b = at::randn({out}, on).to(dtype), dy = at::randn({rows, out}, on).to(dtype);
      const Result ours = run(kernels::linear_cublaslt_cuda, x, w, b, dy), theirs = run(reference_linear, x, w, b, dy);
      EXPECT_TRUE(at::equal(ours.y, theirs.y)) << "y: the same addmm";
      EXPECT_TRUE(at::equal(ours.dx, theirs.dx)) << "dx: the same mm";
      const at::Tensor exact_dw = at::mm(dy.to(at::kDouble).t(), x.to(at::kDouble)), exact_db = dy.to(at::kDouble).sum(0);
      // fp32 accumulation, one rounding to the 16-bit type: as ATen's own, against the exact sums.
      const double tolerance = dtype == at::kBFloat16 ? 1e-2 : 2e-3;
      EXPECT_LE(testing::scaled_error(ours.dw, exact_dw), tolerance) << "dw";
      EXPECT_LE(testing::scaled_error(ours.db, exact_db), tolerance) << "db";
      EXPECT_LE(testing::scaled_error(theirs.dw, exact_dw), tolerance) << "ATen's dw, for scale";
      if (rows >= 64) {  // shapes cuBLASLt serves: the epilogue GEMM itself ran
        at::Tensor dw, db;
        EXPECT_TRUE(kernels::weight_and_bias_gradient_cublaslt(x, dy, dw, db)) << "no cuBLASLt algorithm: nothing fused";
      }
    }
}

TEST(LinearCublasLtCuda, ThreeDimensionalInputUnderAutocastWithFp32Weights) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const auto on = at::TensorOptions().device(at::kCUDA);
  at::manual_seed(7);
  const at::Tensor x = at::randn({4, 256, 768}, on), w = at::randn({2304, 768}, on) * 0.02, b = at::randn({2304}, on) * 0.1;
  const at::Tensor dy = at::randn({4, 256, 2304}, on);
  Result ours, theirs;
  {
    const testing::CudaAutocast autocast(at::kBFloat16);
    ours = run(kernels::linear_cublaslt_cuda, x, w, b, dy);
    theirs = run(reference_linear, x, w, b, dy);
  }
  EXPECT_EQ(ours.y.scalar_type(), at::kBFloat16);
  EXPECT_EQ(ours.y.sizes(), theirs.y.sizes());
  EXPECT_TRUE(at::equal(ours.y, theirs.y));
  EXPECT_EQ(ours.dw.scalar_type(), at::kFloat);  // through autocast's cast, to the fp32 master
  EXPECT_TRUE(at::equal(ours.dx, theirs.dx));
  EXPECT_LE(testing::scaled_error(ours.dw, theirs.dw), 1e-2);
  EXPECT_LE(testing::scaled_error(ours.db, theirs.db), 1e-2);
}

TEST(LinearCublasLtCuda, CallsItDoesNotTakeAreAtenLinears) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const auto on = at::TensorOptions().device(at::kCUDA);
  const at::Tensor x = at::randn({16, 64}, on), w = at::randn({32, 64}, on), b = at::randn({32}, on), dy = at::randn({16, 32}, on);
  const Result fp32 = run(kernels::linear_cublaslt_cuda, x, w, b, dy), fp32_ref = run(reference_linear, x, w, b, dy);
  EXPECT_TRUE(at::equal(fp32.y, fp32_ref.y) && at::equal(fp32.dw, fp32_ref.dw) && at::equal(fp32.db, fp32_ref.db));
  const Result plain = run(kernels::linear_cublaslt_cuda, x.to(at::kBFloat16), w.to(at::kBFloat16), at::Tensor(), dy);
  const Result plain_ref = run(reference_linear, x.to(at::kBFloat16), w.to(at::kBFloat16), at::Tensor(), dy);
  EXPECT_TRUE(at::equal(plain.y, plain_ref.y) && at::equal(plain.dw, plain_ref.dw));
}

#else
TEST(LinearCublasLtCuda, BuiltWithoutNvcc) { GTEST_SKIP() << "this build has no CUDA kernels (nvcc not found)"; }
#endif

}  // namespace
}  // namespace strata
