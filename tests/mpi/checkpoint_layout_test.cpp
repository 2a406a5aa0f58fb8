// A tensor sharded in two levels (a block along one dimension over one group, then a flat range
// of that block over another) saved under one layout loads bit-exactly under others: whole,
// split along the other dimension, and flat pieces of the whole tensor. Runs at 4 ranks (and
// skips at 2) under the strata_comm_tests executable.
#include <filesystem>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "../../core/src/checkpoint/checkpoint.h"
#include "mpi_world.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

// The whole tensor every layout is a view of: 8 x 6 distinct values.
at::Tensor whole() { return at::arange(48, at::kFloat).mul_(0.5).add_(1).view({8, 6}); }

// A block [start, start + size) of the whole tensor `shape`, then elements from `offset` of it.
Placement placed(std::vector<int64_t> shape, int64_t offset, std::vector<int64_t> start = {}, std::vector<int64_t> size = {}) {
  Placement p;
  p.shape = std::move(shape);
  p.offset = offset;
  p.block_start = std::move(start);
  p.block_size = std::move(size);
  return p;
}

// This rank's request and the values it must receive.
struct Piece {
  engine::TensorRequest request;
  at::Tensor expected;
};

// Rows split over 2 "tensor" ranks (rank / 2), then each block flat-split over 2 "data" ranks.
Piece rows_then_flat(int rank) {
  const int t = rank / 2, d = rank % 2;
  const at::Tensor block = whole().narrow(0, 4 * t, 4).reshape(-1);
  return {{"w", block.narrow(0, 12 * d, 12).clone(), placed({8, 6}, 12 * d, {4 * t, 0}, {4, 6})}, block.narrow(0, 12 * d, 12)};
}

TEST(CheckpointLayouts, TwoLevelShardLoadsUnderThreeOtherLayoutsBitExactly) {
  auto world = testing::mpi_world();
  if (world->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const int rank = world->rank();
  const fs::path dir = fs::temp_directory_path() / "strata_checkpoint_layout_test";
  if (rank == 0) fs::remove_all(dir);
  world->barrier()->wait();

  // Save: each rank its two-level piece.
  Piece mine = rows_then_flat(rank);
  engine::save_checkpoint(dir, {1, "hash", 4}, {{"w", mine.expected.clone()}}, {{"w", *mine.request.placement}}, 1, *world, at::kCPU);
  const engine::Checkpoint checkpoint = engine::Checkpoint::open(dir / "step_00000001");

  // Whole, on every rank.
  std::vector<engine::TensorRequest> whole_request{{"w", at::zeros({8, 6}), std::nullopt}};
  checkpoint.fill(whole_request, rank);
  EXPECT_TRUE(at::equal(whole_request[0].target, whole()));

  // Columns: rank r holds columns [r * 3 / 2, ...): here two ranks take 2 columns, two take 1.
  const int64_t begin = rank * 6 / 4, end = (rank + 1) * 6 / 4;
  std::vector<engine::TensorRequest> column_request{
      {"w", at::zeros({8, end - begin}), placed({8, 6}, 0, {0, begin}, {8, end - begin})}};
  checkpoint.fill(column_request, rank);
  EXPECT_TRUE(at::equal(column_request[0].target, whole().narrow(1, begin, end - begin)));

  // Flat pieces of the whole tensor (zero/fsdp on 4 ranks): 12 elements each.
  std::vector<engine::TensorRequest> flat_request{{"w", at::zeros({12}), placed({8, 6}, 12 * rank)}};
  checkpoint.fill(flat_request, rank);
  EXPECT_TRUE(at::equal(flat_request[0].target, whole().reshape(-1).narrow(0, 12 * rank, 12)));

  // And the saved layout itself, by a rank that did not save that piece.
  Piece other = rows_then_flat(3 - rank);
  std::vector<engine::TensorRequest> same_layout{other.request};
  same_layout[0].target = at::zeros({12});
  checkpoint.fill(same_layout, rank);
  EXPECT_TRUE(at::equal(same_layout[0].target, other.expected));

  world->barrier()->wait();
  if (rank == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace strata
