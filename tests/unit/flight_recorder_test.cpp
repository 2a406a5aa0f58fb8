// The collective flight recorder (strata/core/flight_recorder.h): ranks simulated in one process,
// each with its own progress file and a stand-in communicator whose operations never complete
// unless waited on; the diagnosis must name the collective and the rank that never issued it.
#include "strata/core/flight_recorder.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstdlib>
#include <filesystem>

namespace strata {
namespace {

namespace fs = std::filesystem;

class NoWork final : public Work {
 public:
  void wait() override {}
};

// A communicator of `size` ranks that moves no data.
class StandIn final : public Communicator {
 public:
  StandIn(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  WorkPtr all_reduce(at::Tensor, ReduceOp) override { return work(); }
  WorkPtr reduce_scatter(at::Tensor, at::Tensor, ReduceOp) override { return work(); }
  WorkPtr all_gather(at::Tensor, at::Tensor) override { return work(); }
  WorkPtr broadcast(at::Tensor, int) override { return work(); }
  WorkPtr all_to_all(at::Tensor, at::Tensor, std::vector<int64_t>, std::vector<int64_t>) override { return work(); }
  WorkPtr send(at::Tensor, int, int) override { return work(); }
  WorkPtr recv(at::Tensor, int, int) override { return work(); }
  WorkPtr batch_p2p(std::vector<P2POp>) override { return work(); }
  WorkPtr barrier() override { return work(); }
  std::shared_ptr<Communicator> split(const std::vector<int>& ranks) override {
    const auto at = std::find(ranks.begin(), ranks.end(), rank_);
    return std::make_shared<StandIn>(static_cast<int>(at - ranks.begin()), static_cast<int>(ranks.size()));
  }

 private:
  static WorkPtr work() { return std::make_shared<NoWork>(); }
  int rank_, size_;
};

// `n` simulated ranks, each with a beacon writing its progress file and a recorded world.
struct Ranks {
  explicit Ranks(int n, const std::string& name) : dir(fs::path(STRATA_TEST_SCRATCH_DIR) / ("flight_" + name)) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    ::setenv("STRATA_PROGRESS_DIR", dir.c_str(), 1);
    for (int r = 0; r < n; ++r) {
      beacons.push_back(std::make_unique<ProgressBeacon>(r));
      worlds.push_back(record_collectives(std::make_shared<StandIn>(r, n), *beacons.back()));
    }
    ::unsetenv("STRATA_PROGRESS_DIR");
  }
  CollectiveDiagnosis diagnose() {
    std::vector<ProgressFile> files(beacons.size());
    std::vector<bool> present(beacons.size());
    for (size_t r = 0; r < beacons.size(); ++r) present[r] = read_progress_file(dir, static_cast<int>(r), files[r]);
    json = flight_record_json(files, present);
    return diagnose_collectives(files, present);
  }
  fs::path dir;
  std::vector<std::unique_ptr<ProgressBeacon>> beacons;
  std::vector<std::shared_ptr<Communicator>> worlds;
  std::string json;
};

at::Tensor grad() { return at::zeros({4}); }

TEST(FlightRecorder, NamesTheRankThatNeverIssuedTheCollective) {
  Ranks ranks(3, "behind");
  for (int r = 0; r < 3; ++r) ranks.worlds[r]->all_reduce(grad(), ReduceOp::Sum)->wait();  // #1, done everywhere
  ranks.worlds[0]->all_reduce(grad(), ReduceOp::Sum);  // #2: ranks 0 and 2 wait in it, rank 1 never came
  ranks.worlds[2]->all_reduce(grad(), ReduceOp::Sum);
  const CollectiveDiagnosis d = ranks.diagnose();
  EXPECT_EQ(d.culprits, std::vector<int>{1});
  EXPECT_EQ(d.cause, "rank 1 has not issued all_reduce #2 of group \"world: ranks 0,1,2\" (its last there: #1, at step 0), which ranks 0, 2 wait in");
  EXPECT_NE(ranks.json.find("\"pending\": true"), std::string::npos) << ranks.json;
}

TEST(FlightRecorder, KeepsGroupsOfTheSameShapeApart) {
  // Two data groups {0,1} and {2,3}: rank 2 waits in its group's first collective, which rank 3
  // never issued; ranks 0 and 1 completed theirs and are not blamed.
  Ranks ranks(4, "groups");
  std::vector<std::shared_ptr<Communicator>> data;
  for (int r = 0; r < 4; ++r) {
    data.push_back(ranks.worlds[r]->split(r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3}));
    label_group(*data.back(), "data");
  }
  data[0]->all_reduce(grad(), ReduceOp::Sum)->wait();
  data[1]->all_reduce(grad(), ReduceOp::Sum)->wait();
  data[2]->all_reduce(grad(), ReduceOp::Sum);
  const CollectiveDiagnosis d = ranks.diagnose();
  EXPECT_EQ(d.culprits, std::vector<int>{3});
  EXPECT_NE(d.cause.find("all_reduce #1 of group \"data: ranks 2,3\""), std::string::npos) << d.cause;
  EXPECT_NE(d.cause.find("(its last there: none recorded"), std::string::npos) << d.cause;
}

TEST(FlightRecorder, NamesDesynchronisedPrograms) {
  Ranks ranks(2, "mismatch");
  ranks.worlds[0]->all_reduce(grad(), ReduceOp::Sum);
  ranks.worlds[1]->all_gather(grad(), grad());
  const CollectiveDiagnosis d = ranks.diagnose();
  EXPECT_EQ(d.culprits, std::vector<int>{1});
  EXPECT_EQ(d.cause, "rank 1 issued all_gather as #1 of group \"world: ranks 0,1\" where rank 0 issued all_reduce (the ranks run different programs)");
}

TEST(FlightRecorder, NamesThePeerAPointToPointWaitsFor) {
  Ranks ranks(2, "p2p");
  ranks.worlds[0]->recv(grad(), 1, 0);
  const CollectiveDiagnosis d = ranks.diagnose();
  EXPECT_EQ(d.culprits, std::vector<int>{1});
  EXPECT_EQ(d.cause, "rank 1 waits in no operation (at step 0) while rank 0 waits in recv from it on group \"world: ranks 0,1\"");
}

TEST(FlightRecorder, SaysWhenEveryRankIssuedIt) {
  Ranks ranks(2, "all_issued");
  ranks.worlds[0]->barrier();
  ranks.worlds[1]->barrier();
  const CollectiveDiagnosis d = ranks.diagnose();
  EXPECT_TRUE(d.culprits.empty());
  EXPECT_EQ(d.cause, "every rank of group \"world: ranks 0,1\" issued barrier #1 and it never completed");
}

TEST(FlightRecorder, InertWithoutASupervisor) {
  ::unsetenv("STRATA_PROGRESS_DIR");
  ProgressBeacon beacon(0);
  auto world = std::make_shared<StandIn>(0, 1);
  EXPECT_EQ(record_collectives(world, beacon).get(), world.get());
}

}  // namespace
}  // namespace strata
