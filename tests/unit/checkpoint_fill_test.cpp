// Checkpoint::fill's coverage in one process: a piece that is a flat range of the whole tensor
// fills flat and block requests where it overlaps them, and a request it covers only in part is
// refused naming how much of it the checkpoint holds (flat pieces are tracked as ranges, block
// pieces as elements: both paths).
#include <filesystem>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "../../core/src/checkpoint/checkpoint.h"
#include "strata/core/local_communicator.h"
#include "strata/errors.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

at::Tensor whole() { return at::arange(48, at::kFloat).add_(1).view({8, 6}); }

Placement placed(int64_t offset, std::vector<int64_t> start = {}, std::vector<int64_t> size = {}) {
  Placement p;
  p.shape = {8, 6};
  p.offset = offset;
  p.block_start = std::move(start);
  p.block_size = std::move(size);
  return p;
}

std::string refusal(const engine::Checkpoint& checkpoint, engine::TensorRequest request) {
  std::vector<engine::TensorRequest> requests{std::move(request)};
  try {
    checkpoint.fill(requests, 0);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(CheckpointFill, PartialPiecesFillWhatTheyHoldAndRefuseTheRest) {
  const fs::path dir = fs::temp_directory_path() / "strata_checkpoint_fill_test";
  fs::remove_all(dir);
  // One rank saved elements [12, 30) of the 8 x 6 tensor (rows 2-4, the first half of row 4),
  // and a whole tensor "b" beside it.
  auto world = local_communicator();
  engine::save_checkpoint(dir, {1, "hash", 1}, {{"w", whole().reshape(-1).narrow(0, 12, 18).clone()}, {"b", at::ones({3})}},
                          {{"w", placed(12)}}, 1, *world, at::kCPU);
  const engine::Checkpoint checkpoint = engine::Checkpoint::open(dir / "step_00000001");

  // Flat ranges inside it, across two pieces' worth of requests, and a block of rows 2-3.
  std::vector<engine::TensorRequest> inside{{"w", at::zeros({12}), placed(14)},
                                            {"w", at::zeros({2, 6}), placed(0, {2, 0}, {2, 6})},
                                            {"b", at::zeros({3}), std::nullopt}};
  checkpoint.fill(inside, 0);
  EXPECT_TRUE(at::equal(inside[0].target, whole().reshape(-1).narrow(0, 14, 12)));
  EXPECT_TRUE(at::equal(inside[1].target, whole().narrow(0, 2, 2)));
  EXPECT_TRUE(at::equal(inside[2].target, at::ones({3})));

  // Partly held: the whole tensor (a flat request), a flat range running past it, a block of
  // rows 1-2 (6 of its 12 elements held) and columns 0-1 (6 of its 16).
  EXPECT_NE(refusal(checkpoint, {"w", at::zeros({8, 6}), std::nullopt}).find("holds only 18 of the 48 elements of 'w'"),
            std::string::npos);
  EXPECT_NE(refusal(checkpoint, {"w", at::zeros({12}), placed(24)}).find("holds only 6 of the 12 elements of 'w'"), std::string::npos);
  EXPECT_NE(refusal(checkpoint, {"w", at::zeros({2, 6}), placed(0, {1, 0}, {2, 6})}).find("holds only 6 of the 12 elements"),
            std::string::npos);
  EXPECT_NE(refusal(checkpoint, {"w", at::zeros({8, 2}), placed(0, {0, 0}, {8, 2})}).find("holds only 6 of the 16 elements"),
            std::string::npos);
  EXPECT_NE(refusal(checkpoint, {"missing", at::zeros({2}), std::nullopt}).find("has no tensor 'missing'"), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace strata
