// Flash snapshot slots (strata/core/flash_checkpoint.h): double buffering, checksums, complete
// sets, and persisting a set to an ordinary checkpoint.
#include "strata/core/flash_checkpoint.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>

#include "strata/errors.h"
#include "strata/core/safetensors.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::path(STRATA_TEST_SCRATCH_DIR) / ("flash_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

NamedTensors state(float value) {
  return {{"model/w", at::full({64, 33}, value)}, {"model/b", at::arange(7, at::kLong)}, {"rng/state", at::full({5}, value * 2)}};
}

void write(FlashWriter& writer, int64_t step, int64_t world, float value) {
  std::string problem;
  ASSERT_EQ(writer.write({step, world, "hash"}, state(value), {{"step", std::to_string(step)}}, problem), FlashWrite::Written) << problem;
  writer.wait();
}

// Persist at breakpoint overlapped with the restart: a rank about to restore waits while the
// supervisor's marker stands, and not at all without one (or past its timeout).
TEST(FlashCheckpoint, RestoreWaitsForTheBreakpointPersist) {
  const fs::path dir = scratch("breakpoint");
  EXPECT_FALSE(wait_for_breakpoint_persist(dir, 5.0));
  std::ofstream(breakpoint_persist_marker(dir)).put('\n');
  const auto started = std::chrono::steady_clock::now();
  std::thread supervisor([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    fs::remove(breakpoint_persist_marker(dir));
  });
  EXPECT_TRUE(wait_for_breakpoint_persist(dir, 30.0));
  EXPECT_GE(std::chrono::steady_clock::now() - started, std::chrono::milliseconds(100));
  EXPECT_FALSE(fs::exists(breakpoint_persist_marker(dir)));
  supervisor.join();
  std::ofstream(breakpoint_persist_marker(dir)).put('\n');  // a supervisor that never removes it
  EXPECT_TRUE(wait_for_breakpoint_persist(dir, 0.05));
  fs::remove_all(dir);
}

// Simulated nodes: each node's store holds its own ranks' images; a store lists only what it
// holds, and the supervisor's view (complete_flash_sets over the run's directory) sees a set only
// while every node still holds its part.
TEST(FlashCheckpoint, NodeStoresHoldTheirOwnRanks) {
  const fs::path dir = scratch("nodes");
  {
    FlashWriter rank0(flash_node_store(dir, 0), 0), rank1(flash_node_store(dir, 0), 1), rank2(flash_node_store(dir, 1), 2);
    for (FlashWriter* w : {&rank0, &rank1, &rank2}) write(*w, 5, 3, 1.0f);
  }
  EXPECT_EQ(flash_node_store(dir, 1), dir / "node_1");
  const auto node1 = flash_images(flash_node_store(dir, 1));
  ASSERT_EQ(node1.size(), 1u);
  EXPECT_EQ(node1[0].rank, 2);
  EXPECT_EQ(node1[0].info.step, 5);
  EXPECT_EQ(flash_images(flash_node_store(dir, 0)).size(), 2u);
  ASSERT_EQ(complete_flash_sets(dir).size(), 1u);
  EXPECT_EQ(complete_flash_sets(dir)[0].slots[2].parent_path(), flash_node_store(dir, 1));
  fs::remove_all(flash_node_store(dir, 1));  // node 1 lost, memory and all
  EXPECT_TRUE(complete_flash_sets(dir).empty());
}

// Replica placement: a ring of nodes, each rank's image to the rank of the same index on the
// next R nodes; never to its own node; a smaller node (a shrunk world) takes indices modulo its
// size; too few nodes is refused by name.
TEST(FlashCheckpoint, ReplicasGoAroundARingOfNodes) {
  using Ranks = std::vector<std::vector<int>>;
  EXPECT_EQ(replica_receivers({0, 0, 1, 1}, 1), (Ranks{{2}, {3}, {0}, {1}}));
  EXPECT_EQ(replica_receivers({0, 1, 2}, 1), (Ranks{{1}, {2}, {0}}));
  EXPECT_EQ(replica_receivers({0, 1, 2}, 2), (Ranks{{1, 2}, {2, 0}, {0, 1}}));
  EXPECT_EQ(replica_receivers({0, 0, 1, 1, 2}, 1), (Ranks{{2}, {3}, {4}, {4}, {0}}));
  EXPECT_EQ(replica_receivers({3, 3, 7, 7}, 1), (Ranks{{2}, {3}, {0}, {1}}));  // node ids need not be 0..K-1
  EXPECT_EQ(replica_receivers({0, 0}, 0), (Ranks{{}, {}}));
  try {
    replica_receivers({0, 0, 1, 1}, 2);
    FAIL() << "two replicas on two nodes";
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(), "[job] snapshot_replicas = 2 needs 3 nodes or more; this job's ranks are on 2 nodes "
                           "(on one machine: strata run -n N --simulate-nodes K)");
  }
}

// A replica received into a slot named after the sender is an image of that rank in this store,
// counted once complete; the receiver's own check empties it when it does not match the sender's
// checksum.
TEST(FlashCheckpoint, ADamagedReplicaStopsCounting) {
  const fs::path sender_store = scratch("replica_sender"), store = scratch("replica_receiver");
  FlashWriter sender(sender_store, 2);
  write(sender, 4, 3, 1.5f);
  const auto sent = sender.newest(/*with_checksum=*/true);
  ASSERT_TRUE(sent);
  FlashWriter replica(store, 2);
  std::string problem;
  FlashReceive into = replica.begin_receive(sent->info, sent->image.size(), problem);
  ASSERT_NE(into.image, nullptr) << problem;
  std::memcpy(into.image, sent->image.data(), sent->image.size());
  replica.finish_receive(into, sent->checksum);
  replica.check_newest_receive();
  replica.wait();
  auto held = flash_images(store);
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].rank, 2);
  EXPECT_EQ(held[0].info.step, 4);
  EXPECT_FALSE(flash_slot_problem(held[0].slot));
  // The next one arrives damaged: it does not count, and the previous replica stays.
  FlashImageInfo next = sent->info;
  next.step = 5;
  into = replica.begin_receive(next, sent->image.size(), problem);
  ASSERT_NE(into.image, nullptr) << problem;
  std::memcpy(into.image, sent->image.data(), sent->image.size());
  into.image[10] ^= 1;
  replica.finish_receive(into, sent->checksum);
  EXPECT_EQ(flash_images(store).size(), 2u);  // complete: it counts, and whoever uses it checks it
  replica.check_newest_receive();
  replica.wait();
  held = flash_images(store);
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].info.step, 4);
}

TEST(FlashCheckpoint, ChecksumSeesEveryByte) {
  std::vector<unsigned char> bytes(1000 + 5);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 31);
  const uint64_t before = flash_checksum(bytes.data(), bytes.size());
  for (size_t at : {size_t{0}, size_t{31}, size_t{999}, size_t{1004}}) {
    bytes[at] ^= 1;
    EXPECT_NE(flash_checksum(bytes.data(), bytes.size()), before) << "byte " << at;
    bytes[at] ^= 1;
  }
  EXPECT_EQ(flash_checksum(bytes.data(), bytes.size()), before);
  EXPECT_NE(flash_checksum(bytes.data(), bytes.size() - 1), before);
}

// The copy into a slot streams 16-byte blocks after an unaligned head: tensors of sizes that are
// no multiple of 16, at every offset, come out as the file write_safetensors writes, byte for byte.
TEST(FlashCheckpoint, ImageIsTheCheckpointFileByteForByte) {
  const fs::path dir = scratch("image");
  NamedTensors tensors;
  for (int64_t n : {1, 7, 16, 17, 33, 1000, 4099})
    tensors.emplace_back("t" + std::to_string(n), at::randint(256, {n}, at::kByte));
  tensors.emplace_back("strided", at::arange(60, at::kFloat).reshape({6, 10}).t());  // not contiguous
  FlashWriter writer(dir, 0);
  std::string problem;
  ASSERT_EQ(writer.write({3, 1, "hash"}, tensors, {{"step", "3"}}, problem), FlashWrite::Written) << problem;
  writer.wait();
  const auto sets = complete_flash_sets(dir);
  ASSERT_EQ(sets.size(), 1u);
  EXPECT_FALSE(flash_slot_problem(sets[0].slots[0]));
  const MappedFlashSet mapped = map_flash_set(sets[0]);
  write_safetensors(dir / "expected.safetensors", tensors, {{"step", "3"}});
  std::ifstream file(dir / "expected.safetensors", std::ios::binary);
  const std::string expected((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  EXPECT_EQ(std::string(mapped.images[0]), expected);
}

TEST(FlashCheckpoint, DoubleBufferingKeepsTheTwoNewest) {
  const fs::path dir = scratch("double");
  FlashWriter rank0(dir, 0), rank1(dir, 1);
  for (int64_t step = 1; step <= 3; ++step) {
    write(rank0, step, 2, static_cast<float>(step));
    write(rank1, step, 2, static_cast<float>(step));
  }
  const auto sets = complete_flash_sets(dir);
  ASSERT_EQ(sets.size(), 2u);
  EXPECT_EQ(sets[0].info.step, 3);
  EXPECT_EQ(sets[1].info.step, 2);
  // The images are checkpoint files: the tensors come back as written.
  const MappedFlashSet mapped = map_flash_set(sets[0]);
  ASSERT_EQ(mapped.images.size(), 2u);
  const NamedTensors back = parse_safetensors(mapped.images[1], "rank 1");
  ASSERT_EQ(back.size(), 3u);
  EXPECT_TRUE(back[0].second.equal(at::full({64, 33}, 3.0f)));
  EXPECT_TRUE(back[1].second.equal(at::arange(7, at::kLong)));
}

TEST(FlashCheckpoint, AKillMidCopyLeavesThePreviousSnapshot) {
  const fs::path dir = scratch("midcopy");
  FlashWriter writer(dir, 0);
  write(writer, 1, 1, 1.0f);
  write(writer, 2, 1, 2.0f);
  std::string problem;
  // The copy of step 3 stops halfway (an exception stands in for the kill): its slot stays Writing.
  EXPECT_THROW(writer.write({3, 1, "hash"}, state(3.0f), {}, problem, [] { throw std::runtime_error("killed"); }), std::runtime_error);
  const auto sets = complete_flash_sets(dir);
  ASSERT_EQ(sets.size(), 1u);
  EXPECT_EQ(sets[0].info.step, 2);
}

TEST(FlashCheckpoint, ASetNeedsEveryRankOfItsWorld) {
  const fs::path dir = scratch("incomplete");
  FlashWriter rank0(dir, 0), rank1(dir, 1);
  write(rank0, 1, 2, 1.0f);
  write(rank1, 1, 2, 1.0f);
  write(rank0, 2, 2, 2.0f);  // rank 1 has not written step 2
  const auto sets = complete_flash_sets(dir);
  ASSERT_EQ(sets.size(), 1u);
  EXPECT_EQ(sets[0].info.step, 1);
}

TEST(FlashCheckpoint, DamageIsFoundAndRefusedByPersist) {
  const fs::path dir = scratch("damage"), checkpoints = scratch("damage_ckpt");
  FlashWriter writer(dir, 0);
  write(writer, 4, 1, 4.0f);
  auto sets = complete_flash_sets(dir);
  ASSERT_EQ(sets.size(), 1u);
  EXPECT_FALSE(flash_slot_problem(sets[0].slots[0]).has_value());
  writer.damage_newest();
  const auto problem = flash_slot_problem(sets[0].slots[0]);
  ASSERT_TRUE(problem.has_value());
  EXPECT_NE(problem->find("fails its checksum"), std::string::npos);
  EXPECT_THROW(persist_flash_set(sets[0], checkpoints, 3), UserError);
  EXPECT_FALSE(fs::exists(checkpoints / "latest"));
}

TEST(FlashCheckpoint, PersistWritesAnOrdinaryCheckpointAndReleasesTheSlots) {
  const fs::path dir = scratch("persist"), checkpoints = scratch("persist_ckpt");
  FlashWriter rank0(dir, 0), rank1(dir, 1);
  write(rank0, 8, 2, 8.0f);
  write(rank1, 8, 2, 8.0f);
  const auto sets = complete_flash_sets(dir);
  ASSERT_EQ(sets.size(), 1u);
  const uint64_t bytes = persist_flash_set(sets[0], checkpoints, 3);
  EXPECT_EQ(bytes, fs::file_size(checkpoints / "step_00000008" / "rank_00000.safetensors") +
                       fs::file_size(checkpoints / "step_00000008" / "rank_00001.safetensors"));
  std::ifstream latest(checkpoints / "latest");
  std::string name;
  latest >> name;
  EXPECT_EQ(name, "step_00000008");
  EXPECT_TRUE(read_safetensors(checkpoints / "step_00000008" / "rank_00001.safetensors")[0].second.equal(at::full({64, 33}, 8.0f)));
  // Released: the writers may take both slots again, and the set is still complete.
  write(rank0, 9, 2, 9.0f);
  write(rank1, 9, 2, 9.0f);
  EXPECT_EQ(complete_flash_sets(dir).size(), 2u);
}

}  // namespace
}  // namespace strata
