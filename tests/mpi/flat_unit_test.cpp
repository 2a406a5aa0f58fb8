// Flat units (plugins/sharding) in mixed precision, over the mpi communicator: full parameters
// gathered in the compute dtype from fp32 shards, and gradients averaged in the reduce dtype
// into fp32 chunks. Run under mpirun with 2 and 4 ranks (see tests/CMakeLists.txt).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "../../plugins/sharding/flat_unit.h"
#include "mpi_world.h"

namespace strata {
namespace {

using sharding::FlatUnit;
using sharding::GradReduce;
using sharding::UnitDtypes;
using NamedParams = std::vector<std::pair<std::string, at::Tensor>>;

// Two fp32 parameters (22 elements, so the last chunk is padded at 4 ranks) whose values are not
// exact in bf16.
NamedParams make_params() {
  NamedParams params;
  params.emplace_back("a", (at::arange(15, at::kFloat) * 1e-3 + 1.0).reshape({3, 5}).requires_grad_());
  params.emplace_back("b", (at::arange(7, at::kFloat) * -1e-3 - 0.5).requires_grad_());
  return params;
}

// Parameters of the same values that a unit may take over (it moves their data into its buffer).
NamedParams copy_of(const NamedParams& original) {
  NamedParams params;
  for (const auto& [name, p] : original) params.emplace_back(name, p.detach().clone().requires_grad_());
  return params;
}

// Rank k's gradient of every element: `fine` ones are 1 + (k + 1) / 1024, which bf16 rounds to
// 1; the others are 1 + k / 128, exact in bf16 while their average is not.
double rank_gradient(int k, bool fine) { return fine ? 1.0 + (k + 1) / 1024.0 : 1.0 + k / 128.0; }

// The average of every rank's gradient, each rounded to `dtype` before the sum (in fp32, as the
// mpi communicator sums half precision) and the mean rounded to `dtype` again.
double expected_average(int ranks, bool fine, at::ScalarType dtype) {
  at::Tensor sum = at::zeros({}, at::kFloat);
  for (int k = 0; k < ranks; ++k) sum += at::scalar_tensor(rank_gradient(k, fine), at::kFloat).to(dtype).to(at::kFloat);
  return (sum / ranks).to(dtype).to(at::kFloat).item<double>();
}

void set_gradients(FlatUnit& unit, int rank, bool fine) {
  unit.begin_backward();
  for (size_t i = 0; i < unit.params().size(); ++i) {
    const at::Tensor& p = unit.params()[i].second;
    p.mutable_grad() = at::full(p.sizes(), rank_gradient(rank, fine), p.options().requires_grad(false));
    unit.mark_ready(i);
  }
}

TEST(FlatUnitPrecision, GathersInTheComputeDtypeFromFp32Shards) {
  auto& comm = *testing::mpi_world();
  const NamedParams original = make_params();
  NamedParams params = copy_of(original);
  FlatUnit unit("unit", params, comm, GradReduce::ReduceScatter, /*persistent_params=*/false,
                UnitDtypes{at::kBFloat16, at::kFloat});

  // Released: the full buffer holds no memory; the pieces this rank keeps are exact fp32.
  EXPECT_FALSE(unit.gathered());
  EXPECT_EQ(params[0].second.storage().nbytes(), 0u);
  for (size_t i = 0; i < params.size(); ++i) {
    const sharding::Piece& piece = unit.pieces()[i];
    if (!piece.data.defined()) continue;
    EXPECT_EQ(piece.data.scalar_type(), at::kFloat);
    EXPECT_TRUE(at::equal(piece.data, original[i].second.detach().reshape(-1).narrow(0, piece.placement.offset, piece.data.numel())));
  }

  unit.wait_gathered();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].second.scalar_type(), at::kBFloat16) << params[i].first;
    EXPECT_TRUE(at::equal(params[i].second, original[i].second.detach().to(at::kBFloat16))) << params[i].first;
  }
  EXPECT_EQ(unit.gather_bytes(), unit.reduce_bytes() / 2);
  unit.release();
  EXPECT_EQ(params[0].second.storage().nbytes(), 0u);
}

// Gradients in bf16 (the gathered parameters' dtype) averaged in fp32 or bf16 into fp32 chunks.
class ReduceScatterDtype : public ::testing::TestWithParam<at::ScalarType> {};

TEST_P(ReduceScatterDtype, AveragesIntoFp32Chunks) {
  auto& comm = *testing::mpi_world();
  NamedParams params = make_params();
  FlatUnit unit("unit", params, comm, GradReduce::ReduceScatter, /*persistent_params=*/false,
                UnitDtypes{at::kBFloat16, GetParam()});
  unit.wait_gathered();
  set_gradients(unit, comm.rank(), /*fine=*/false);
  unit.start_reduce();
  unit.wait_reduced();
  EXPECT_FALSE(params[0].second.grad().defined());  // reduce-scatter frees the full gradient
  const double expected = expected_average(comm.size(), /*fine=*/false, GetParam());
  EXPECT_EQ(expected == expected_average(comm.size(), /*fine=*/false, at::kFloat), GetParam() == at::kFloat);
  for (const auto& piece : unit.pieces()) {
    if (!piece.grad.defined()) continue;
    EXPECT_EQ(piece.grad.scalar_type(), at::kFloat);
    EXPECT_TRUE(at::all(piece.grad == expected).item<bool>()) << piece.name << " " << piece.grad << " vs " << expected;
  }
}


// fsdp's reduce_every_micro_batch: shares reduced before the final one are summed in the chunk.
// Three micro-batches, the first two reductions not final and the second started while the first
// is still in flight; the third finds b's gradient absent (reduced already, as a held-back weight
// gradient would be) and adds zero for it. Each share's average is rounded to the reduce dtype,
// the sum kept in fp32; the next step's first share overwrites the chunk.
TEST_P(ReduceScatterDtype, SharesSumInTheChunk) {
  auto& comm = *testing::mpi_world();
  NamedParams params = make_params();
  FlatUnit unit("unit", params, comm, GradReduce::ReduceScatter, /*persistent_params=*/false, UnitDtypes{at::kBFloat16, GetParam()});
  unit.wait_gathered();
  const double share = expected_average(comm.size(), /*fine=*/false, GetParam());
  for (int step = 0; step < 2; ++step) {
    set_gradients(unit, comm.rank(), /*fine=*/false);
    unit.start_reduce(/*final=*/false);
    set_gradients(unit, comm.rank(), /*fine=*/false);
    unit.start_reduce(/*final=*/false);
    set_gradients(unit, comm.rank(), /*fine=*/false);
    params[1].second.mutable_grad() = at::Tensor();
    unit.start_reduce(/*final=*/true);
    unit.wait_reduced();
    for (size_t i = 0; i < params.size(); ++i) {
      const sharding::Piece& piece = unit.pieces()[i];
      if (!piece.grad.defined()) continue;
      const double expected = (i == 0 ? 3 : 2) * share;
      EXPECT_TRUE(at::all(piece.grad == expected).item<bool>()) << "step " << step << " " << piece.name << " " << piece.grad << " vs " << expected;
    }
  }
}
INSTANTIATE_TEST_SUITE_P(Dtypes, ReduceScatterDtype, ::testing::Values(at::kFloat, at::kBFloat16));

// zero1's persistent fp32 units with gradients averaged in bf16: the averages lose the parts bf16
// cannot hold, and parameters keep fp32 gradients.
TEST(FlatUnitPrecision, AllReduceInBf16RoundsTheGradients) {
  auto& comm = *testing::mpi_world();
  NamedParams params = make_params();
  FlatUnit unit("bucket", params, comm, GradReduce::AllReduce, /*persistent_params=*/true, UnitDtypes{std::nullopt, at::kBFloat16});
  set_gradients(unit, comm.rank(), /*fine=*/true);
  unit.start_reduce();
  unit.wait_reduced();
  const double expected = expected_average(comm.size(), /*fine=*/true, at::kBFloat16);
  EXPECT_EQ(expected, 1.0);
  EXPECT_NE(expected_average(comm.size(), /*fine=*/true, at::kFloat), 1.0);
  for (const auto& [name, p] : params) {
    EXPECT_EQ(p.grad().scalar_type(), at::kFloat) << name;
    EXPECT_TRUE(at::all(p.grad() == expected).item<bool>()) << name;
  }
}

TEST(FlatUnitPrecision, PersistentUnitsRefuseAnotherGatherDtype) {
  auto& comm = *testing::mpi_world();
  EXPECT_THROW(FlatUnit("bucket", make_params(), comm, GradReduce::ReduceScatter, /*persistent_params=*/true,
                        UnitDtypes{at::kBFloat16, std::nullopt}),
               std::logic_error);
}

// Offsets to the full parameters (Job::offset_full_parameters, WSAM's local perturbation under
// fsdp): each rank's own, added to every gather while set, once per gather, through the flat
// buffer (the parameters' autograd version is untouched); cleared, the next gather gives the
// shards' values back. A persistent unit adds them at once and takes back its exact values.
at::Tensor rank_offset(const at::Tensor& p, int rank) { return at::full(p.sizes(), 0.25 * (rank + 1), at::kFloat); }

TEST(FlatUnitOffsets, EveryGatherAddsThemUntilCleared) {
  auto& comm = *testing::mpi_world();
  const NamedParams original = make_params();
  NamedParams params = copy_of(original);
  FlatUnit unit("unit", params, comm, GradReduce::ReduceScatter, /*persistent_params=*/false);
  const at::Tensor& a = params[0].second;
  unit.wait_gathered();
  const auto version = a._version();
  unit.set_full_offsets({{"a", rank_offset(a, comm.rank())}, {"elsewhere", at::ones({2})}});
  EXPECT_FALSE(unit.gathered()) << "a gathered unit lets its parameters go when the offsets change";
  for (int gather = 0; gather < 2; ++gather) {
    unit.wait_gathered();
    EXPECT_TRUE(at::equal(a, original[0].second.detach() + rank_offset(a, comm.rank()))) << "gather " << gather;
    EXPECT_TRUE(at::equal(params[1].second, original[1].second.detach())) << "b has no offset";
    unit.wait_gathered();  // already gathered: nothing added again
    EXPECT_TRUE(at::equal(a, original[0].second.detach() + rank_offset(a, comm.rank())));
    unit.release();
  }
  EXPECT_EQ(a._version(), version);
  unit.set_full_offsets({});
  unit.wait_gathered();
  EXPECT_TRUE(at::equal(a, original[0].second.detach()));
  EXPECT_THROW(unit.set_full_offsets({{"a", at::ones({15})}}), std::logic_error) << "an offset of another shape";
}

TEST(FlatUnitOffsets, APersistentUnitTakesBackItsExactValues) {
  auto& comm = *testing::mpi_world();
  const NamedParams original = make_params();
  NamedParams params = copy_of(original);
  FlatUnit unit("ignored", params, comm, GradReduce::AllReduce, /*persistent_params=*/true);
  // 1/3 is not exact in fp32: subtracting it again would not give the values back.
  unit.set_full_offsets({{"b", at::full({7}, 1.0 / 3.0, at::kFloat)}});
  EXPECT_TRUE(at::allclose(params[1].second, original[1].second.detach() + 1.0 / 3.0));
  EXPECT_TRUE(at::equal(params[0].second, original[0].second.detach()));
  unit.set_full_offsets({});
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(at::equal(params[i].second, original[i].second.detach())) << params[i].first;
}

}  // namespace
}  // namespace strata
