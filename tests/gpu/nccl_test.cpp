// The nccl backend on one GPU (world size 1): every collective on CUDA tensors. Skips without a
// CUDA device, as on CI.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "strata/comm.h"
#include "strata/errors.h"
#include "strata/core/local_communicator.h"
#include "strata/core/plugin_loader.h"

namespace strata {
namespace {

std::shared_ptr<Communicator> nccl_world() {
  static ComponentRegistry registry;
  static std::shared_ptr<Communicator> world = [] {
    PluginLoader(registry).load_search_path({installed_plugin_dir()});
    const auto* backend = static_cast<const CommunicatorBackend*>(registry.find(ComponentKind::Communicator, "nccl"));
    return backend ? backend->world(*local_communicator()) : nullptr;
  }();
  return world;
}

class Nccl : public ::testing::TestWithParam<at::ScalarType> {
 protected:
  void SetUp() override {
    if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
    ASSERT_NE(nccl_world(), nullptr) << "nccl backend not built";
  }
  at::TensorOptions cuda() const { return at::TensorOptions().device(at::kCUDA).dtype(GetParam()); }
};

TEST_P(Nccl, EveryCollectiveOnOneRank) {
  auto& comm = *nccl_world();
  ASSERT_EQ(comm.size(), 1);
  at::Tensor x = at::arange(8, cuda());
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min}) {
    at::Tensor t = x.clone();
    comm.all_reduce(t, op)->wait();
    EXPECT_TRUE(at::equal(t.cpu(), x.cpu()));
  }
  if (at::isFloatingType(GetParam())) {
    at::Tensor t = x.clone();
    comm.all_reduce(t, ReduceOp::Avg)->wait();
    EXPECT_TRUE(at::equal(t.cpu(), x.cpu()));
  }
  at::Tensor out = at::empty({8}, cuda());
  comm.all_gather(out, x)->wait();
  EXPECT_TRUE(at::equal(out.cpu(), x.cpu()));
  at::Tensor scattered = at::empty({8}, cuda());
  comm.reduce_scatter(scattered, x, ReduceOp::Sum)->wait();
  EXPECT_TRUE(at::equal(scattered.cpu(), x.cpu()));
  at::Tensor b = x.clone();
  comm.broadcast(b, 0)->wait();
  EXPECT_TRUE(at::equal(b.cpu(), x.cpu()));
  at::Tensor a2a = at::empty({8}, cuda());
  comm.all_to_all(a2a, x, {}, {})->wait();
  EXPECT_TRUE(at::equal(a2a.cpu(), x.cpu()));
  comm.all_to_all(a2a, x, {8}, {8})->wait();
  EXPECT_TRUE(at::equal(a2a.cpu(), x.cpu()));
  comm.barrier()->wait();
}

// A batch that sends to and receives from this rank itself: one NCCL group, both directions.
TEST_P(Nccl, BatchedSendAndReceiveToSelf) {
  auto& comm = *nccl_world();
  const auto options = at::TensorOptions().dtype(GetParam()).device(at::kCUDA);
  at::Tensor out = at::arange(1000, options), in = at::zeros({1000}, options);
  comm.batch_p2p({{P2POp::Kind::Send, out, 0, 0}, {P2POp::Kind::Recv, in, 0, 0}})->wait();
  EXPECT_TRUE(at::equal(in.cpu(), out.cpu()));
}

TEST_P(Nccl, RefusesHostTensors) {
  EXPECT_THROW(nccl_world()->all_reduce(at::ones({2}, GetParam()), ReduceOp::Sum), UserError);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Nccl, ::testing::Values(at::kFloat, at::kBFloat16, at::kHalf, at::kLong));

}  // namespace
}  // namespace strata
