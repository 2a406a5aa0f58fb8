// Snapshot replicas ([job] snapshot_replicas = R, issue 61): every flash snapshot of a node is
// also held in the shared memory of the next R nodes of a ring (node k's images go to nodes
// k+1 .. k+R), so that losing a whole node, its ranks and its memory, loses no snapshot (DLRover
// pairs nodes and backs each one's shard up in its partner's memory; Megatron's local checkpoints
// replicate rank n's to n+J, n+2J, ...; the ring is the same idea for any node count).
//
// Rank r's image goes to the rank with r's index within its node on each of those nodes (a node
// of fewer ranks takes the index modulo its size). The bytes ride on the job's communicator as
// non-blocking point-to-point messages, on a communicator split off for replicas so that they
// never match the step's own messages. Each image's size and identity ride on the snapshot's
// agreement (the all-reduce by which every rank learns that every rank wrote its snapshot), so a
// receiver takes its slot as it leaves the agreement, with no exchange of its own. After the
// step's record each rank posts its image's sends and its receives as one batch (NCCL runs a
// communicator's messages in order on one stream: a receive posted ahead of the send it waits
// for would stall a ring); the transfer overlaps the steps until the next snapshot, whose
// agreement carries the image's checksum. So replicas add no meeting of ranks to a snapshot:
// before its copy a rank waits only for its own transfers. The receiver writes
// straight into a slot of its node's store named after the sender (rank_Q.0/.1, double-buffered
// like the sender's own). A replica counts once every byte has arrived and the sender's checksum
// with it, which is at the next snapshot's agreement: after a node loss the survivors restore the
// newest snapshot whose replicas are complete, which may be one before the newest. Every use of
// an image checks that checksum (a restore, the supervisor's persist), and the receiver also
// checks it in the background after its next snapshot's copy, emptying the slot of a damaged
// replica. Memory per node: its own images plus the images of R other nodes, double-buffered.
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

// Collective over `world`: every rank's node (LaunchEnv::node), by rank.
std::vector<int64_t> nodes_of_ranks(Communicator& world, int node, c10::Device device);

class SnapshotReplicas {
 public:
  // Collective over `world`: learns every rank's node and splits off the replicas' communicator.
  // Throws UserError when the ranks are on fewer than R + 1 nodes.
  SnapshotReplicas(Communicator& world, int node, int64_t replicas, const std::filesystem::path& store, c10::Device device);
  ~SnapshotReplicas();
  SnapshotReplicas(const SnapshotReplicas&) = delete;
  SnapshotReplicas& operator=(const SnapshotReplicas&) = delete;

  // Before the next snapshot is written: waits for the transfers in flight (sent during the
  // steps since, so normally done) and takes the checksum of the image this rank sent.
  void complete(FlashWriter& own);
  // This rank's part of the snapshot's agreement (a sum over the world): one row per rank, its
  // own filled with the identity and size of its newest image when it `written` one, and the
  // checksum of the image it sent last when its receivers wait for it; the others 0.
  std::vector<int64_t> agreement_rows(FlashWriter& own, bool written) const;
  // Once the agreement says no rank failed (`rows`: every rank's row, as summed): the images
  // received since the last agreement count from now, with their senders' checksums. With
  // `announce` (every rank wrote this snapshot) it then starts checking them against those
  // checksums (in the background, after the snapshot's own copy, so the two do not share the
  // cores) and takes the slots of this node's store that this rank's senders' new images go to.
  // It waits for nothing.
  void agreed(const std::vector<double>& rows, bool announce);
  // After the step's record: posts `own`'s newest image to this rank's receivers and the
  // receives of its senders' images, one batch, and returns.
  void post(FlashWriter& own);
  // The end of the run, when no snapshot follows: completes the last transfers, exchanges their
  // checksums in an all-reduce of the same rows, and starts checking them.
  void finish(FlashWriter& own);
  // After a restart from `step`: replicas of later steps belong to the attempt being redone.
  void discard_after(int64_t step);

  // "rank 1 -> ranks 3; from ranks 3": this rank's part of the ring, for the log.
  std::string describe() const;

 private:
  struct Incoming;
  std::shared_ptr<Communicator> channel_;
  c10::Device device_;
  std::vector<int> receivers_, senders_;
  std::map<int, std::unique_ptr<FlashWriter>> replica_slots_;  // by sender
  std::vector<WorkPtr> in_flight_;
  std::vector<std::unique_ptr<Incoming>> incoming_, arrived_;
  std::vector<at::Tensor> outgoing_;  // the sends' buffers, alive until they complete
  bool announced_ = false;  // agreed on a snapshot whose image is not posted yet
  bool sent_ = false;  // posted an image whose checksum its receivers have not had yet
  uint64_t sent_checksum_ = 0;

  void check_received();
};

}  // namespace strata::engine
