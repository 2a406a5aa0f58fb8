// add_layer_norm.fused_cuda and add_rms_norm.fused_cuda (kernels/cuda/*_norm_kernels.cu) on a GPU
// against the unfused residual step they replace: ATen's add, then layer_norm.fused_cuda /
// rms_norm.fused_cuda, the sum's two gradients added by autograd and the branch's cast by the
// add's backward. Bit for bit: the sum, the norm, the gradients of the residual, the branch and
// the weight (and bias): an fp32 residual with an fp32, bf16 or half branch (amp's GPT and Llama
// blocks), 16-bit sums for RMSNorm; widths in and beyond the LayerNorm's registers; with the norm
// served by its autocast-output form under autocast; and a block whose norm is pinned to the
// reference gets the reference. Skips without a CUDA device (or a build without nvcc).
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>

#include "autocast_scope.h"
#include "cuda/layer_norm_cuda.h"
#include "cuda/rms_norm_cuda.h"
#include "strata/core/component_registry.h"
#include "strata/core/operator_table.h"
#include "strata/core/plugin_loader.h"
#include "strata/ops.h"
#include "../bitwise_equal.h"

namespace strata {
namespace {

#ifdef STRATA_HAVE_CUDA_KERNELS

struct Grads {
  at::Tensor sum, normed, d_residual, d_x, d_w, d_b;
};

// step(residual, x, w, b) -> {sum, normed}; d_sum into the sum, d_y into the norm.
template <class Step>
Grads run(Step step, const at::Tensor& r0, const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& b0, const at::Tensor& d_sum,
          const at::Tensor& d_y) {
  at::Tensor r = r0.clone().requires_grad_(true), x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
  at::Tensor b = b0.defined() ? b0.clone().requires_grad_(true) : at::Tensor();
  const ops::AddNormResult out = step(r, x, w, b);
  std::vector<at::Tensor> inputs{r, x, w};
  if (b.defined()) inputs.push_back(b);
  const auto g = torch::autograd::grad({out.sum, out.normed}, inputs,
                                       {d_sum.to(out.sum.scalar_type()), d_y.to(out.normed.scalar_type())});
  return {out.sum.detach(), out.normed.detach(), g[0], g[1], g[2], b.defined() ? g[3] : at::Tensor()};
}

using testing::expect_bitwise_equal;

void expect_same(const Grads& a, const Grads& b) {
  expect_bitwise_equal(a.sum, b.sum, "sum");
  expect_bitwise_equal(a.normed, b.normed, "normed");
  expect_bitwise_equal(a.d_residual, b.d_residual, "residual gradient");
  expect_bitwise_equal(a.d_x, b.d_x, "x gradient");
  expect_bitwise_equal(a.d_w, b.d_w, "weight gradient");
  expect_bitwise_equal(a.d_b, b.d_b, "bias gradient");
}

bool fused_node(const at::Tensor& sum) { return sum.grad_fn() && sum.grad_fn()->name().find("Norm") != std::string::npos; }

class AddNormCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
    PluginLoader(registry_).load_search_path({installed_plugin_dir()});
    OperatorTable::global().install(registry_);
  }
  void TearDown() override { OperatorTable::global().reset(); }
  ComponentRegistry registry_;
};

const auto add_ln = [](const at::Tensor& r, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return kernels::add_layer_norm_fused_cuda(r, x, w, b.defined() ? std::optional<at::Tensor>(b) : std::nullopt, 1e-5);
};
const auto add_then_ln = [](const at::Tensor& r, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  const at::Tensor sum = r + x;
  return ops::AddNormResult{sum, ops::layer_norm(sum, w, b.defined() ? std::optional<at::Tensor>(b) : std::nullopt, 1e-5)};
};
const auto add_rms = [](const at::Tensor& r, const at::Tensor& x, const at::Tensor& w, const at::Tensor&) {
  return kernels::add_rms_norm_fused_cuda(r, x, w, 1e-5);
};
const auto add_then_rms = [](const at::Tensor& r, const at::Tensor& x, const at::Tensor& w, const at::Tensor&) {
  const at::Tensor sum = r + x;
  return ops::AddNormResult{sum, ops::rms_norm(sum, w, 1e-5)};
};

TEST_F(AddNormCuda, LayerNormBitForBitTheAddAndTheFusedNorm) {
  const auto on = at::TensorOptions().device(at::kCUDA);
  ASSERT_EQ(ops::select("layer_norm", at::zeros({1}, on)).name(), "layer_norm.fused_cuda");
  for (const at::ScalarType branch : {at::kFloat, at::kBFloat16, at::kHalf})
    for (const auto& [rows, dim] : std::vector<std::pair<int64_t, int64_t>>{{8192, 768}, {33, 256}, {5, 7}, {300, 1600}, {64, 4096}})
      for (const bool bias : {true, false}) {
        SCOPED_TRACE(std::string(c10::toString(branch)) + " branch, " + std::to_string(rows) + " x " + std::to_string(dim) +
                     (bias ? ", bias" : ", no bias"));
        at::manual_seed(rows + dim);
        const at::Tensor r = at::randn({rows, dim}, on) * 2, x = (at::randn({rows, dim}, on) + 0.5).to(branch);
        const at::Tensor w = at::rand({dim}, on) + 0.5, b = bias ? at::randn({dim}, on) : at::Tensor();
        const at::Tensor d_sum = at::randn({rows, dim}, on), d_y = at::randn({rows, dim}, on);
        const Grads ours = run(add_ln, r, x, w, b, d_sum, d_y);
        expect_same(ours, run(add_then_ln, r, x, w, b, d_sum, d_y));
        EXPECT_TRUE(fused_node(add_ln(r.clone().requires_grad_(true), x, w, b).sum));
      }
}

// Under autocast with layer_norm pinned to its autocast-output form: the norm comes out in the
// 16-bit type, as that form's own output, and the gradients as the unfused step's.
TEST_F(AddNormCuda, LayerNormFollowsTheAutocastOutputNorm) {
  const auto on = at::TensorOptions().device(at::kCUDA);
  ops::pin("layer_norm", "layer_norm.autocast_out_cuda");
  at::manual_seed(3);
  const at::Tensor r = at::randn({1024, 768}, on), x = at::randn({1024, 768}, on).to(at::kBFloat16);
  const at::Tensor w = at::rand({768}, on) + 0.5, b = at::randn({768}, on), d = at::randn({1024, 768}, on);
  const testing::CudaAutocast autocast(at::kBFloat16);
  const Grads ours = run(add_ln, r, x, w, b, d, d);
  EXPECT_EQ(ours.normed.scalar_type(), at::kBFloat16);
  expect_same(ours, run(add_then_ln, r, x, w, b, d, d));
}

TEST_F(AddNormCuda, RmsNormBitForBitTheAddAndTheFusedNorm) {
  const auto on = at::TensorOptions().device(at::kCUDA);
  ASSERT_EQ(ops::select("rms_norm", at::zeros({1}, on)).name(), "rms_norm.fused_cuda");
  struct Types {
    at::ScalarType residual, x, w;
  };
  for (const Types t : {Types{at::kFloat, at::kFloat, at::kFloat}, Types{at::kFloat, at::kBFloat16, at::kFloat},
                        Types{at::kFloat, at::kHalf, at::kFloat}, Types{at::kBFloat16, at::kBFloat16, at::kBFloat16},
                        Types{at::kBFloat16, at::kBFloat16, at::kFloat}, Types{at::kHalf, at::kHalf, at::kHalf}})
    for (const auto& [rows, dim] : std::vector<std::pair<int64_t, int64_t>>{{8192, 2048}, {33, 256}, {5, 7}}) {
      SCOPED_TRACE(std::string(c10::toString(t.residual)) + " residual, " + c10::toString(t.x) + " x, " + c10::toString(t.w) +
                   " weight, " + std::to_string(rows) + " x " + std::to_string(dim));
      at::manual_seed(rows + dim);
      const at::Tensor r = (at::randn({rows, dim}, on) * 2).to(t.residual), x = (at::randn({rows, dim}, on) + 0.5).to(t.x);
      const at::Tensor w = (at::rand({dim}, on) + 0.5).to(t.w), d_sum = at::randn({rows, dim}, on), d_y = at::randn({rows, dim}, on);
      expect_same(run(add_rms, r, x, w, at::Tensor(), d_sum, d_y), run(add_then_rms, r, x, w, at::Tensor(), d_sum, d_y));
    }
}

TEST_F(AddNormCuda, RmsNormFollowsTheAutocastOutputNorm) {
  const auto on = at::TensorOptions().device(at::kCUDA);
  ops::pin("rms_norm", "rms_norm.autocast_out_cuda");
  at::manual_seed(4);
  const at::Tensor r = at::randn({1024, 2048}, on), x = at::randn({1024, 2048}, on).to(at::kBFloat16);
  const at::Tensor w = at::rand({2048}, on) + 0.5, d = at::randn({1024, 2048}, on);
  const testing::CudaAutocast autocast(at::kBFloat16);
  const Grads ours = run(add_rms, r, x, w, at::Tensor(), d, d);
  EXPECT_EQ(ours.normed.scalar_type(), at::kBFloat16);
  expect_same(ours, run(add_then_rms, r, x, w, at::Tensor(), d, d));
}

// A norm pinned to its reference keeps its pin inside the residual step.
TEST_F(AddNormCuda, APinnedNormIsNeverBypassed) {
  const auto on = at::TensorOptions().device(at::kCUDA);
  ops::pin("layer_norm", "layer_norm.reference");
  ops::pin("rms_norm", "rms_norm.reference");
  const at::Tensor r = at::randn({16, 64}, on), x = at::randn({16, 64}, on), w = at::rand({64}, on) + 0.5, d = at::randn({16, 64}, on);
  expect_same(run(add_ln, r, x, w, at::Tensor(), d, d), run(add_then_ln, r, x, w, at::Tensor(), d, d));
  expect_same(run(add_rms, r, x, w, at::Tensor(), d, d), run(add_then_rms, r, x, w, at::Tensor(), d, d));
  EXPECT_FALSE(fused_node(add_ln(r.clone().requires_grad_(true), x, w, at::Tensor()).sum));
  EXPECT_FALSE(fused_node(add_rms(r.clone().requires_grad_(true), x, w, at::Tensor()).sum));
}

#else
TEST(AddNormCuda, BuiltWithoutNvcc) { GTEST_SKIP() << "this build has no CUDA kernels (nvcc not found)"; }
#endif

}  // namespace
}  // namespace strata
