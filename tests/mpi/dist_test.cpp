// Differentiable collectives against single-process references: every rank builds the same full
// tensors from a fixed seed, computes the whole computation and its gradients with plain ATen,
// runs the distributed version on its pieces, and compares values and gradients (double
// precision: equal up to summation order). Runs at 2 and 4 ranks, and on subgroups of 2 at 4.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "mpi_world.h"
#include "strata/dist.h"

namespace strata {
namespace {

at::Tensor seeded(std::vector<int64_t> shape, uint64_t seed) {
  at::manual_seed(seed);
  return at::randn(shape, at::kDouble);
}

bool close(const at::Tensor& a, const at::Tensor& b) { return at::allclose(a, b, 1e-12, 1e-12); }

// Column-parallel W1 (rows split), row-parallel W2 (columns split): y = (x W1^T) W2^T.
void check_tensor_parallel_mlp(Communicator& group) {
  const int64_t n = group.size(), r = group.rank(), hidden = 8 * n;
  const at::Tensor x = seeded({4, 6}, 1), w1 = seeded({hidden, 6}, 2), w2 = seeded({5, hidden}, 3), c = seeded({4, 5}, 4);
  // Reference.
  at::Tensor xr = x.clone().requires_grad_(), w1r = w1.clone().requires_grad_(), w2r = w2.clone().requires_grad_();
  at::Tensor yr = at::matmul(at::matmul(xr, w1r.t()), w2r.t());
  (yr * c).sum().backward();
  // Distributed.
  const int64_t part = hidden / n;
  at::Tensor xd = x.clone().requires_grad_();
  at::Tensor w1d = w1.narrow(0, r * part, part).clone().requires_grad_(), w2d = w2.narrow(1, r * part, part).clone().requires_grad_();
  at::Tensor yd = dist::reduce_from_group(at::matmul(at::matmul(dist::copy_to_group(xd, group), w1d.t()), w2d.t()), group);
  (yd * c).sum().backward();
  EXPECT_TRUE(close(yd, yr));
  EXPECT_TRUE(close(xd.grad(), xr.grad()));
  EXPECT_TRUE(close(w1d.grad(), w1r.grad().narrow(0, r * part, part)));
  EXPECT_TRUE(close(w2d.grad(), w2r.grad().narrow(1, r * part, part)));
}

TEST(Dist, TensorParallelMlpMatchesOneProcess) { check_tensor_parallel_mlp(*testing::mpi_world()); }

TEST(Dist, SequenceParallelMlpMatchesOneProcess) {
  Communicator& group = *testing::mpi_world();
  const int64_t n = group.size(), r = group.rank(), seq = 2 * n, hidden = 4 * n;
  const at::Tensor x = seeded({seq, 6}, 5), w1 = seeded({hidden, 6}, 6), w2 = seeded({6, hidden}, 7), c = seeded({seq, 6}, 8);
  at::Tensor xr = x.clone().requires_grad_(), w1r = w1.clone().requires_grad_(), w2r = w2.clone().requires_grad_();
  at::Tensor yr = at::matmul(at::matmul(xr, w1r.t()), w2r.t());
  (yr * c).sum().backward();
  // Tokens sharded along the sequence: gather before the column GEMM, reduce-scatter after the row GEMM.
  const int64_t tokens = seq / n, part = hidden / n;
  at::Tensor xd = x.narrow(0, r * tokens, tokens).clone().requires_grad_();
  at::Tensor w1d = w1.narrow(0, r * part, part).clone().requires_grad_(), w2d = w2.narrow(1, r * part, part).clone().requires_grad_();
  at::Tensor yd = dist::reduce_scatter_along(at::matmul(at::matmul(dist::gather_along(xd, 0, group), w1d.t()), w2d.t()), 0, group);
  (yd * c.narrow(0, r * tokens, tokens)).sum().backward();
  EXPECT_TRUE(close(yd, yr.narrow(0, r * tokens, tokens)));
  EXPECT_TRUE(close(xd.grad(), xr.grad().narrow(0, r * tokens, tokens)));
  EXPECT_TRUE(close(w1d.grad(), w1r.grad().narrow(0, r * part, part)));
  EXPECT_TRUE(close(w2d.grad(), w2r.grad().narrow(1, r * part, part)));
}

TEST(Dist, GatherAlongInnerDimensionAndScatterAlong) {
  Communicator& group = *testing::mpi_world();
  const int64_t n = group.size(), r = group.rank();
  const at::Tensor full = seeded({3, 2 * n, 4}, 9), c = seeded({3, 2 * n, 4}, 10);
  // gather_along dim 1: each rank's forward is the full tensor; the backward sums every rank's
  // gradient of its own slice.
  at::Tensor piece = full.narrow(1, 2 * r, 2).clone().requires_grad_();
  at::Tensor gathered = dist::gather_along(piece, 1, group);
  EXPECT_TRUE(at::equal(gathered, full));
  (gathered * c).sum().backward();
  EXPECT_TRUE(close(piece.grad(), c.narrow(1, 2 * r, 2) * static_cast<double>(n)));
  // scatter_along dim -1 (negative dims count from the end): forward the chunk, backward gathers.
  at::Tensor whole = full.clone().requires_grad_();
  at::Tensor chunk = dist::scatter_along(whole.narrow(1, 0, 2), -1, group);
  EXPECT_TRUE(at::equal(chunk, full.narrow(1, 0, 2).narrow(2, r * (4 / n), 4 / n)));
  (chunk * 2).sum().backward();
  EXPECT_TRUE(at::equal(whole.grad().narrow(1, 0, 2), at::full({3, 2, 4}, 2.0, at::kDouble)));
  EXPECT_THROW(dist::scatter_along(full, 0, group), std::invalid_argument);  // 3 rows over n ranks
}

TEST(Dist, UlyssesAllToAllRoundTripAndGradient) {
  Communicator& group = *testing::mpi_world();
  const int64_t n = group.size(), r = group.rank();
  // [b, s, h, d] sequence-sharded: this rank holds tokens [r*3, r*3+3) of every head.
  const at::Tensor full = seeded({2, 3 * n, 2 * n, 5}, 11), c = seeded({2, 3, 2 * n, 5}, 12);
  at::Tensor mine = full.narrow(1, 3 * r, 3).clone().requires_grad_();
  at::Tensor heads = dist::all_to_all(mine, 2, 1, group);  // -> [b, s, h/n, d]
  EXPECT_TRUE(at::equal(heads, full.narrow(2, 2 * r, 2)));
  at::Tensor back = dist::all_to_all(heads, 1, 2, group);  // -> [b, s/n, h, d]
  EXPECT_TRUE(at::equal(back, mine));
  (back * c).sum().backward();
  EXPECT_TRUE(at::equal(mine.grad(), c));
  for (auto type : {at::kFloat, at::kBFloat16, at::kHalf}) {
    at::Tensor t = full.narrow(1, 3 * r, 3).to(type);
    EXPECT_TRUE(at::equal(dist::all_to_all(t, 2, 1, group), full.narrow(2, 2 * r, 2).to(type))) << type;
  }
}

TEST(Dist, OpsStayWithinSubgroups) {
  auto world = testing::mpi_world();
  if (world->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const int r = world->rank();
  auto pair = world->split(r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3});
  check_tensor_parallel_mlp(*pair);
  at::Tensor own = at::full({1}, static_cast<double>(r), at::kDouble);
  EXPECT_EQ(dist::gather_along(own, 0, *pair).sum().item<double>(), r < 2 ? 1.0 : 5.0);
}

}  // namespace
}  // namespace strata
