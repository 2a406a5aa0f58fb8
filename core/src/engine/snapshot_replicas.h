// Snapshot replicas ([job] snapshot_replicas = R, issue 61): every flash snapshot of a node is
// also held in the shared memory of the next R nodes of a ring (node k's images go to nodes
// k+1 .. k+R), so that losing a whole node, its ranks and its memory, loses no snapshot (DLRover
// pairs nodes and backs each one's shard up in its partner's memory; Megatron's local checkpoints
// replicate rank n's to n+J, n+2J, ...; the ring is the same idea for any node count).
//
// Rank r's image goes to the rank with r's index within its node on each of those nodes (a node
// of fewer ranks takes the index modulo its size). The bytes ride on the job's communicator as
// non-blocking point-to-point messages, on a communicator split off for replicas so that they
// never match the step's own messages: posted right after the snapshot, completed just before
// the next one, so the transfer overlaps the steps between. Per snapshot a rank blocks only for
// two small exchanges (the image's size and identity, later its checksum). The receiver writes
// straight into a slot of its node's store named after the sender (rank_Q.0/.1, double-buffered
// like the sender's own), and checks the bytes against the sender's checksum in the background;
// until they match the replica does not count. A replica therefore counts from the next snapshot
// on: after a node loss the survivors restore the newest snapshot whose replicas are complete,
// which may be one before the newest. Memory per node: its own images plus the images of R other
// nodes, each double-buffered.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "strata/comm.h"
#include "strata/core/flash_checkpoint.h"

namespace strata::engine {

class SnapshotReplicas {
 public:
  // Collective over `world`: learns every rank's node and splits off the replicas' communicator.
  // Throws UserError when the ranks are on fewer than R + 1 nodes.
  SnapshotReplicas(Communicator& world, int node, int64_t replicas, const std::filesystem::path& store, c10::Device device);
  ~SnapshotReplicas();
  SnapshotReplicas(const SnapshotReplicas&) = delete;
  SnapshotReplicas& operator=(const SnapshotReplicas&) = delete;

  // Before the next snapshot is written: waits for the replicas in flight and exchanges their
  // checksums (each receiver then checks its copy in the background).
  void complete(FlashWriter& own);
  // After every rank wrote a snapshot: posts `own`'s newest to this rank's receivers, and
  // receives its senders' into this node's store.
  void post(FlashWriter& own);
  // After a restart from `step`: replicas of later steps belong to the attempt being redone.
  void discard_after(int64_t step);

  // "rank 1 -> ranks 3; from ranks 3": this rank's part of the ring, for the log.
  std::string describe() const;
  // This node's memory for flash snapshots: own images and replicas, both slots of each, once
  // every slot has been written (for the console's line after the first replicated snapshot).
  uint64_t bytes_received_per_snapshot() const { return last_received_; }

 private:
  struct Incoming;
  std::shared_ptr<Communicator> channel_;
  c10::Device device_;
  std::vector<int> receivers_, senders_;
  std::map<int, std::unique_ptr<FlashWriter>> replica_slots_;  // by sender
  std::vector<WorkPtr> in_flight_;
  std::vector<std::unique_ptr<Incoming>> incoming_;
  std::vector<at::Tensor> outgoing_;  // the sends' buffers, alive until they complete
  bool sent_ = false;
  uint64_t last_received_ = 0;
};

}  // namespace strata::engine
