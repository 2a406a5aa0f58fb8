// layer_norm.fused_cuda (kernels/cuda/layer_norm_kernels.cu) on a GPU against core's
// layer_norm.reference (at::layer_norm) on the same GPU: y, dx, dw and db in fp32, with and
// without a bias, rows 1 to 8192 (more rows than the backward's row groups), widths that do and
// do not fill a warp or a block (7, 64, 256, 768, 1000 and 1024 forward a warp a row; 1600, GPT-2
// XL's, a block a row in registers; 4096 a block reading the row again), inputs with a large mean (the two-pass
// variance); a 3-D input; and calls the kernel does not take (bf16, fp64), served by
// the reference bit for bit. layer_norm.autocast_out_cuda's 16-bit output and dy against the
// fp32 kernel's. Skips without a CUDA device (or a build without nvcc).
#include <string>
#include <tuple>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "../elementwise_error.h"
#include "autocast_scope.h"
#include "cuda/layer_norm_cuda.h"
#include "strata/core/operator_table.h"

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
  const at::Tensor y = fn(x, w, b, 1e-5);
  std::vector<at::Tensor> inputs{x, w};
  if (b) inputs.push_back(*b);
  const auto grads = torch::autograd::grad({y}, inputs, {dy.to(y.scalar_type())});
  return {y.detach(), grads[0], grads[1], b ? grads[2] : at::Tensor()};
}

const ops::OperatorImpl<ops::LayerNorm>& reference() {
  OperatorTable::global().reset();
  const auto& ref = static_cast<const ops::OperatorImpl<ops::LayerNorm>&>(*OperatorTable::global().implementations("layer_norm").back());
  EXPECT_EQ(ref.name(), "layer_norm.reference");
  return ref;
}

TEST(LayerNormCuda, MatchesTheReference) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const auto& ref = reference();
  const auto on = at::TensorOptions().device(at::kCUDA);
  for (const auto& [rows, dim] : {std::tuple<int64_t, int64_t>{1, 64}, {7, 7}, {33, 256}, {3000, 1000}, {8192, 768}, {77, 1024}, {300, 1600},
                                 {64, 4096}})
    for (bool bias : {false, true})
      for (double offset : {0.5, 100.0}) {
        SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(dim) + (bias ? " bias" : "") + " mean " + std::to_string(offset));
        at::manual_seed(rows + dim);
        const at::Tensor x = at::randn({rows, dim}, on) * 2 + offset, w = at::rand({dim}, on) + 0.5;
        const at::Tensor b = bias ? at::randn({dim}, on) : at::Tensor(), dy = at::randn({rows, dim}, on) * 3;
        const Result ours = run(kernels::layer_norm_fused_cuda, x, w, b, dy), theirs = run(ref.fn(), x, w, b, dy);
        EXPECT_LE(testing::max_elementwise_error(ours.y, theirs.y), 2e-5) << "y";
        EXPECT_LE(testing::scaled_error(ours.dx, theirs.dx), 1e-4) << "dx";
        EXPECT_LE(testing::scaled_error(ours.dw, theirs.dw), 1e-4) << "dw";
        if (bias) EXPECT_LE(testing::scaled_error(ours.db, theirs.db), 1e-5) << "db";
      }
}

TEST(LayerNormCuda, ThreeDimensionalInputAndCallsItDoesNotTake) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const auto& ref = reference();
  const auto on = at::TensorOptions().device(at::kCUDA);
  const at::Tensor x = at::randn({2, 5, 64}, on), w = at::rand({64}, on) + 0.5, b = at::randn({64}, on), dy = at::randn({2, 5, 64}, on);
  const Result ours = run(kernels::layer_norm_fused_cuda, x, w, b, dy), theirs = run(ref.fn(), x, w, b, dy);
  EXPECT_EQ(ours.y.sizes(), theirs.y.sizes());
  EXPECT_LE(testing::max_elementwise_error(ours.y, theirs.y), 2e-5);
  EXPECT_LE(testing::scaled_error(ours.dx, theirs.dx), 1e-4);
  for (const auto& [xt, wt] : {std::pair{at::kBFloat16, at::kBFloat16}, std::pair{at::kDouble, at::kDouble}}) {
    const Result mixed = run(kernels::layer_norm_fused_cuda, x.to(xt), w.to(wt), b.to(wt), dy);
    const Result mixed_ref = run(ref.fn(), x.to(xt), w.to(wt), b.to(wt), dy);
    EXPECT_EQ(testing::max_elementwise_error(mixed.y, mixed_ref.y), 0.0);
    EXPECT_EQ(testing::max_elementwise_error(mixed.dx, mixed_ref.dx), 0.0);
  }
}

// layer_norm.autocast_out_cuda: under autocast, the fp32 kernel's output rounded to bf16 or fp16
// once, and from a 16-bit dy the gradients the fp32 kernel gives from the same values in fp32:
// bit for bit, as the cast after the norm and its backward gave them.
TEST(LayerNormCuda, AutocastOutputIsTheCastOfTheFp32Output) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const auto on = at::TensorOptions().device(at::kCUDA);
  for (const at::ScalarType half : {at::kBFloat16, at::kHalf})
    for (const auto& [rows, dim] : {std::tuple<int64_t, int64_t>{8192, 768}, {33, 256}, {5, 4096}}) {
      SCOPED_TRACE(std::string(c10::toString(half)) + " " + std::to_string(rows) + " x " + std::to_string(dim));
      at::manual_seed(rows + dim);
      const at::Tensor x = at::randn({rows, dim}, on) * 2 + 0.5, w = at::rand({dim}, on) + 0.5, b = at::randn({dim}, on);
      const at::Tensor dy = (at::randn({rows, dim}, on) * 3).to(half);
      Result ours;
      {
        const testing::CudaAutocast autocast(half);
        ours = run(kernels::layer_norm_autocast_out_cuda, x, w, b, dy);
      }
      const Result fp32 = run(kernels::layer_norm_fused_cuda, x, w, b, dy.to(at::kFloat));
      EXPECT_EQ(ours.y.scalar_type(), half);
      EXPECT_TRUE(at::equal(ours.y, fp32.y.to(half))) << "y";
      EXPECT_TRUE(at::equal(ours.dx, fp32.dx)) << "dx";
      EXPECT_TRUE(at::equal(ours.dw, fp32.dw)) << "dw";
      EXPECT_TRUE(at::equal(ours.db, fp32.db)) << "db";
    }
  // Outside autocast it is layer_norm.fused_cuda.
  const at::Tensor x = at::randn({16, 64}, on), w = at::rand({64}, on) + 0.5, b = at::randn({64}, on), dy = at::randn({16, 64}, on);
  const Result plain = run(kernels::layer_norm_autocast_out_cuda, x, w, b, dy), fused = run(kernels::layer_norm_fused_cuda, x, w, b, dy);
  EXPECT_EQ(plain.y.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(plain.y, fused.y) && at::equal(plain.dx, fused.dx));
}

#else
TEST(LayerNormCuda, BuiltWithoutNvcc) { GTEST_SKIP() << "this build has no CUDA kernels (nvcc not found)"; }
#endif

}  // namespace
}  // namespace strata
