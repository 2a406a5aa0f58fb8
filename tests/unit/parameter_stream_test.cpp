// engine::ParameterStream (core/src/checkpoint/parameter_stream.h), the export's way of holding
// one parameter at a time: a parameter is filled when the first tensor viewing it is about to be
// written and not before (with the ones written next, up to a batch of bytes); one viewed by two written tensors is filled once; one nothing writes is
// filled at once; a non-finite value is refused naming the tensor; and a written tensor that is
// no view of a parameter (a to_hf that computes), or two parameters sharing storage, turn the
// stream off (the caller fills everything first).
#include <cmath>
#include <filesystem>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "../../core/src/checkpoint/parameter_stream.h"
#include "strata/core/local_communicator.h"
#include "strata/errors.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

class ParameterStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / "strata_parameter_stream_test";
    fs::remove_all(dir_);
    auto world = local_communicator();
    engine::save_checkpoint(dir_, {1, "hash", 1},
                            {{"model/a", at::arange(6, at::kFloat).view({2, 3})}, {"model/b", at::full({4}, 2.0f)},
                             {"model/c", at::full({2}, 3.0f)}, {"model/bad", at::full({2}, NAN)}},
                            {}, 1, *world, at::kCPU);
  }
  void TearDown() override { fs::remove_all(dir_); }

  engine::Checkpoint open() const { return engine::Checkpoint::open(dir_ / "step_00000001"); }
  static at::Tensor unfilled(std::vector<int64_t> shape) { return at::full(shape, -7.0f); }

  fs::path dir_;
};

TEST_F(ParameterStreamTest, FillsEachParameterJustBeforeItsFirstWrite) {
  const engine::Checkpoint checkpoint = open();
  const at::Tensor a = unfilled({2, 3}), b = unfilled({4}), c = unfilled({2});
  // a written transposed; b as two halves (two written tensors, one parameter); c written by nothing.
  const NamedTensors written{{"A", a.t()}, {"B0", b.narrow(0, 0, 2)}, {"B1", b.narrow(0, 2, 2)}};
  // Batches of at most 1 byte beyond the parameter written next: one parameter a fill.
  engine::ParameterStream stream(checkpoint, {{"model/a", a, std::nullopt}, {"model/b", b, std::nullopt}, {"model/c", c, std::nullopt}},
                                 written, engine::ParameterStream::NonFinite::refused, /*batch_bytes=*/1);
  ASSERT_TRUE(stream.streams());
  EXPECT_TRUE(at::equal(c, at::full({2}, 3.0f))) << "a parameter nothing writes is filled at once";
  EXPECT_TRUE(at::equal(a, unfilled({2, 3})) && at::equal(b, unfilled({4}))) << "nothing else before its write";
  const TensorWriteHooks hooks = stream.hooks();
  hooks.before("A");
  EXPECT_TRUE(at::equal(a, at::arange(6, at::kFloat).view({2, 3})));
  EXPECT_TRUE(at::equal(b, unfilled({4})));
  hooks.after("A");
  hooks.before("B0");
  EXPECT_TRUE(at::equal(b, at::full({4}, 2.0f)));
  b.fill_(5.0f);  // filled once: the second half's write does not read the checkpoint again
  hooks.after("B0");
  hooks.before("B1");
  EXPECT_TRUE(at::equal(b, at::full({4}, 5.0f)));
  hooks.after("B1");
}

TEST_F(ParameterStreamTest, FillsTheParametersWrittenNextTogetherUpToTheBatch) {
  const engine::Checkpoint checkpoint = open();
  const at::Tensor a = unfilled({2, 3}), b = unfilled({4}), c = unfilled({2});
  // a (24 bytes) first: a batch of 30 bytes takes b (16) too, not c.
  engine::ParameterStream stream(checkpoint, {{"model/a", a, std::nullopt}, {"model/b", b, std::nullopt}, {"model/c", c, std::nullopt}},
                                 {{"A", a}, {"B", b}, {"C", c}}, engine::ParameterStream::NonFinite::refused, /*batch_bytes=*/30);
  stream.hooks().before("A");
  EXPECT_TRUE(at::equal(a, at::arange(6, at::kFloat).view({2, 3})));
  EXPECT_TRUE(at::equal(b, at::full({4}, 2.0f)));
  EXPECT_TRUE(at::equal(c, unfilled({2})));
  stream.hooks().before("C");
  EXPECT_TRUE(at::equal(c, at::full({2}, 3.0f)));
}

TEST_F(ParameterStreamTest, KeepsNonFiniteValuesWhenAsked) {
  const engine::Checkpoint checkpoint = open();
  const at::Tensor bad = unfilled({2});
  engine::ParameterStream stream(checkpoint, {{"model/bad", bad, std::nullopt}}, {{"BAD", bad}}, engine::ParameterStream::NonFinite::kept);
  stream.hooks().before("BAD");
  EXPECT_TRUE(bad.isnan().all().item<bool>());
}

TEST_F(ParameterStreamTest, RefusesANonFiniteParameterByName) {
  const engine::Checkpoint checkpoint = open();
  const at::Tensor bad = unfilled({2});
  engine::ParameterStream stream(checkpoint, {{"model/bad", bad, std::nullopt}}, {{"BAD", bad}});
  ASSERT_TRUE(stream.streams());
  try {
    stream.hooks().before("BAD");
    FAIL() << "a NaN parameter was written";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor for 'bad' holds NaN or infinite values"), std::string::npos) << e.what();
  }
}

TEST_F(ParameterStreamTest, AWriteItsHookRefusesLeavesNoFile) {
  const engine::Checkpoint checkpoint = open();
  const at::Tensor bad = unfilled({2});
  engine::ParameterStream stream(checkpoint, {{"model/bad", bad, std::nullopt}}, {{"BAD", bad}});
  const fs::path out = dir_ / "out.safetensors";
  EXPECT_THROW(write_safetensors(out, {{"BAD", bad}}, {}, {}, at::ScalarType::Undefined, stream.hooks()), UserError);
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(dir_ / "out.safetensors.tmp"));
}

TEST_F(ParameterStreamTest, TensorsThatAreNoViewsOrSharedStorageTurnTheStreamOff) {
  const engine::Checkpoint checkpoint = open();
  const at::Tensor a = unfilled({2, 3});
  engine::ParameterStream computed(checkpoint, {{"model/a", a, std::nullopt}}, {{"A", a.t().contiguous()}});
  EXPECT_FALSE(computed.streams());
  EXPECT_FALSE(computed.hooks().before);
  computed.fill_all();
  EXPECT_TRUE(at::equal(a, at::arange(6, at::kFloat).view({2, 3})));

  const at::Tensor halves = unfilled({4});
  engine::ParameterStream shared(checkpoint, {{"model/c", halves.narrow(0, 0, 2), std::nullopt}, {"model/c", halves.narrow(0, 2, 2), std::nullopt}},
                                 {{"C", halves}});
  EXPECT_FALSE(shared.streams());
}

}  // namespace
}  // namespace strata
