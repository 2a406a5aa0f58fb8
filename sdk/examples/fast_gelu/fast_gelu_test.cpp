// The override matches the reference in fp32 (values and gradients, to fp32 rounding: the two
// evaluate tanh differently), is chosen only for fp32 CPU tensors, and a short training run
// with it loaded works.
#include <filesystem>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "strata/core/operator_table.h"
#include "strata/ops.h"
#include "strata/testing.h"

namespace {

class FastGelu : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_ = strata::testing::load_plugins({FAST_GELU_PLUGIN_DIR});
    strata::OperatorTable::global().install(*registry_);
  }
  void TearDown() override { strata::OperatorTable::global().reset(); }
  std::unique_ptr<strata::ComponentRegistry> registry_;
};

TEST_F(FastGelu, MatchesTheReferenceInFloat) {
  at::manual_seed(0);
  at::Tensor x = (at::randn({1000}) * 3).requires_grad_(true);
  ASSERT_EQ(strata::OperatorTable::global().select("gelu", x).name(), "gelu.fast_fp32_cpu");
  at::Tensor ours = strata::ops::gelu(x), reference = at::gelu(x, "tanh");
  EXPECT_TRUE(at::allclose(ours, reference, 1e-5, 1e-6)) << (ours - reference).abs().max().item<double>();
  at::Tensor up = at::randn({1000});
  at::Tensor g_ours = torch::autograd::grad({ours}, {x}, {up})[0], g_ref = torch::autograd::grad({reference}, {x}, {up})[0];
  EXPECT_TRUE(at::allclose(g_ours, g_ref, 1e-5, 1e-5)) << (g_ours - g_ref).abs().max().item<double>();
}

// Other dtypes go to the next implementation by priority that supports them: Strata's bundled
// gelu.fused_cpu for bf16, the reference for fp64.
TEST_F(FastGelu, OtherDtypesUseTheNextImplementation) {
  EXPECT_NE(strata::OperatorTable::global().select("gelu", at::zeros({2}, at::kBFloat16)).name(), "gelu.fast_fp32_cpu");
  EXPECT_EQ(strata::OperatorTable::global().select("gelu", at::zeros({2}, at::kDouble)).name(), "gelu.reference");
  at::Tensor x = at::randn({10}, at::kDouble);
  EXPECT_TRUE(at::equal(strata::ops::gelu(x), at::gelu(x, "tanh")));
}

TEST(FastGeluTraining, TrainsWithTheOverride) {
  const auto run = std::filesystem::temp_directory_path() / "strata_fast_gelu_example_test";
  std::filesystem::remove_all(run);
  auto summary = strata::testing::train(R"(
[job]
model = "gpt"
dataset = "synthetic"
steps = 3
global_batch = 2
eval_every = 0
checkpoint_every = 0
log_every = 100
[model]
n_layer = 1
n_head = 2
d_model = 16
vocab_size = 32
seq_len = 8
[data]
vocab_size = 32
)", run, {FAST_GELU_PLUGIN_DIR});
  EXPECT_EQ(summary.last_step, 3);
  EXPECT_TRUE(std::isfinite(summary.last_loss));
  std::filesystem::remove_all(run);
}

}  // namespace
