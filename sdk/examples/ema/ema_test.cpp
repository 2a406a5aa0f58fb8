// Trains a few steps with the ema pass, checkpointing every step, and checks the recurrence
// shadow_t = decay * shadow_(t-1) + (1 - decay) * weight_t in the saved checkpoints.
#include <cstdio>
#include <filesystem>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "strata/core/safetensors.h"
#include "strata/testing.h"

namespace {

const char* kStrategy = R"(
[job]
model = "gpt"
dataset = "synthetic"
steps = 4
global_batch = 2
eval_every = 0
checkpoint_every = 1
keep_checkpoints = 10
log_every = 100
[model]
n_layer = 1
n_head = 2
d_model = 16
vocab_size = 32
seq_len = 8
[data]
vocab_size = 32
[[pass]]
name = "ema"
decay = 0.75
)";

strata::NamedTensors checkpoint(const std::filesystem::path& run, int step) {
  char dir[32];
  std::snprintf(dir, sizeof dir, "step_%08d", step);
  return strata::read_safetensors(run / "checkpoints" / dir / "rank_00000.safetensors");
}

at::Tensor named(const strata::NamedTensors& tensors, const std::string& name) {
  for (const auto& [n, t] : tensors)
    if (n == name) return t;
  ADD_FAILURE() << "no tensor " << name;
  return at::zeros({1});
}

TEST(Ema, CheckpointsHoldTheMovingAverage) {
  const auto run = std::filesystem::temp_directory_path() / "strata_ema_example_test";
  std::filesystem::remove_all(run);
  strata::testing::train(kStrategy, run, {EMA_PLUGIN_DIR});
  int checked = 0;
  for (int step = 2; step <= 4; ++step) {
    auto previous = checkpoint(run, step - 1), current = checkpoint(run, step);
    for (const auto& [name, weight] : current) {
      if (name.rfind("model/", 0) != 0) continue;
      const std::string param = name.substr(6);
      at::Tensor average = named(current, "ema/" + param);
      at::Tensor want = 0.75 * named(previous, "ema/" + param) + 0.25 * weight;
      EXPECT_TRUE(at::allclose(average, want, 1e-6, 1e-7)) << param << " at step " << step;
      EXPECT_FALSE(at::equal(average, weight)) << param << " at step " << step;
      ++checked;
    }
  }
  EXPECT_GE(checked, 3 * 10);
  std::filesystem::remove_all(run);
}

TEST(Ema, DecayOutOfRangeIsRefused) {
  auto registry = strata::testing::load_plugins({EMA_PLUGIN_DIR});
  const auto& pass = strata::testing::component<strata::Pass>(*registry, strata::ComponentKind::Pass, "ema");
  EXPECT_EQ(pass.info().schema.find("decay")->max, 1.0);
  EXPECT_THROW(strata::testing::train(std::string(kStrategy) + "\n", "/nonexistent/ema", {EMA_PLUGIN_DIR}, {"pass.ema.decay=2"}),
               strata::UserError);
}

}  // namespace
