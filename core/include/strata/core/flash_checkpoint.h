// Flash checkpoints: every rank copies its checkpoint file, byte for byte what it would write to
// disk, into shared memory; the supervisor (launcher/flash_persister.h), not the trainer, writes
// the snapshots to disk in the background, and at a failure before restarting; a restarted rank
// loads the newest snapshot from memory when every image of it passes its checksum, else from
// disk. Training blocks only for the copy.
//
// Each rank owns two slot files, <dir>/rank_R.0 and rank_R.1 (double buffering): a snapshot goes
// into the older one, so a rank killed mid-copy leaves its previous snapshot whole. A slot is a
// 4 KiB header then the image. Its state word moves Empty -> Writing -> Checksumming -> Valid on
// the rank's side, and Valid <-> Persisting on the supervisor's (compare-and-swap on the shared
// mapping), so a rank never overwrites a slot being persisted and the supervisor never persists
// one being written. The checksum (64-bit, four lanes, several GB/s) is computed by a background
// thread of the rank after the copy; until it is written the slot is not Valid.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "strata/optimizer.h"
#include "strata/core/safetensors.h"

namespace strata {

// The shared-memory directory of a run: /dev/shm/strata-flash-<hash of the run directory's
// absolute path> (or under /tmp where /dev/shm is missing).
STRATA_API std::filesystem::path flash_directory(const std::filesystem::path& run_dir);

// One node's snapshot store inside it: <flash directory>/node_K. A rank writes into and reads
// from its own node's store only (LaunchEnv::node); images of ranks on other nodes reach it over
// the communicator. On one machine with `strata run --simulate-nodes K` the stores are K
// directories side by side; on real nodes each host's /dev/shm holds its own.
STRATA_API std::filesystem::path flash_node_store(const std::filesystem::path& flash_dir, int node);

enum class FlashSlotState : int32_t { Empty = 0, Writing = 1, Checksumming = 2, Valid = 3, Persisting = 4 };

// What a snapshot is of; recorded in each slot's header.
struct FlashImageInfo {
  int64_t step = 0;
  int64_t world_size = 1;
  std::string state_hash;
};

enum class FlashWrite { Written, Skipped, Failed };

// Where a replica's bytes go (FlashWriter::begin_receive); image null: nowhere.
struct FlashReceive {
  char* image = nullptr;
  int slot = -1;
};

// A snapshot's image as its slot holds it, with its checksum.
struct FlashImageView {
  FlashImageInfo info;
  uint64_t checksum = 0;
  std::string_view image;
};

// Thrown by persist_flash_set when a rank took a slot of the set back before it could be held:
// routine while ranks run (the next snapshot is persisted instead), not a failure.
struct FlashSetChanged : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The rank's side: writes snapshots into its two slots.
class STRATA_API FlashWriter {
 public:
  FlashWriter(std::filesystem::path dir, int rank);
  ~FlashWriter();
  FlashWriter(const FlashWriter&) = delete;
  FlashWriter& operator=(const FlashWriter&) = delete;

  // Copies `tensors` as a safetensors image (`metadata` in its header) into the older slot;
  // `halfway` runs when half the tensors are copied (fault injection). The newest snapshot is
  // never overwritten: when the older slot is being persisted the snapshot is Skipped. Failed,
  // writing nothing, when shared memory cannot hold the image (`problem` says why).
  FlashWrite write(const FlashImageInfo& info, const NamedTensors& tensors, const Metadata& metadata, std::string& problem,
             const std::function<void()>& halfway = {});
  // Empties this rank's slots holding snapshots of steps after `step`: after a restart from
  // `step`, they belong to a run that is being redone.
  void discard_after(int64_t step);
  // The newest snapshot written, or none; `with_checksum` waits for its checksum (else 0). Its
  // bytes stay put until the snapshot after next (the next one goes into the other slot).
  std::optional<FlashImageView> newest(bool with_checksum);
  // A replica: another node's image of rank `rank` (the writer's) arriving over the network.
  // begin_receive takes the older slot and says where the `bytes` go (nowhere when the slot is
  // held by the supervisor, or shared memory cannot hold it: `problem`), without waiting for the
  // check of the previous replica in the other slot. Once every byte is there, finish_receive
  // records the sender's checksum and makes the slot Valid: like every image, it is checked
  // against that checksum by whoever uses it (a restore, the supervisor's persist).
  // check_newest_receive also checks it in the background at once and empties the slot when
  // the bytes do not match, so a damaged replica stops counting.
  FlashReceive begin_receive(const FlashImageInfo& info, uint64_t bytes, std::string& problem);
  void finish_receive(const FlashReceive& receive, uint64_t checksum);
  void check_newest_receive();
  // Waits for the newest snapshot's checksum (it is Valid after this).
  void wait();
  // Fault injection: flips one byte of the newest snapshot's image after its checksum.
  void damage_newest();

 private:
  struct Slot;
  bool prepare(Slot& slot, uint64_t bytes, std::string& problem, bool populate);
  int take_older_slot(const FlashImageInfo& info, uint64_t bytes);
  std::filesystem::path dir_;
  int rank_;
  std::unique_ptr<Slot> slots_[2];
  std::thread checksum_;
  int newest_ = -1;
  int checking_ = -1;  // the slot the background thread is checking, -1: none
};

// A snapshot every rank of one world holds at one step: a complete flash checkpoint.
struct FlashSet {
  FlashImageInfo info;
  std::vector<std::filesystem::path> slots;  // slot r holds rank r's image
};

// Every complete set in `dir` and the node stores inside it, newest first (states only;
// checksums are not verified here): the supervisor's view, which on one machine stands in for
// every node's agent persisting its own ranks' images.
STRATA_API std::vector<FlashSet> complete_flash_sets(const std::filesystem::path& dir);

// One rank's snapshot in a store.
struct FlashImageRef {
  FlashImageInfo info;
  int rank = 0;
  std::filesystem::path slot;
};
// Every snapshot one store (`dir` alone, not the stores inside it) holds, whatever its rank.
STRATA_API std::vector<FlashImageRef> flash_images(const std::filesystem::path& dir);

// Recomputes the checksum of one slot's image; nullopt when it matches, else why not.
STRATA_API std::optional<std::string> flash_slot_problem(const std::filesystem::path& slot);

// Persist at breakpoint, overlapped with the restart: while the supervisor writes the newest
// snapshot of a failed attempt to disk, the next attempt's ranks already start (load libtorch,
// build the model) and wait only before restoring, so that they see that checkpoint on disk and
// no new snapshot of theirs can overwrite the slots being written. The marker file
// `<flash directory>/.persisting` exists while that persist runs.
STRATA_API std::filesystem::path breakpoint_persist_marker(const std::filesystem::path& flash_dir);
// A rank about to restore: waits while the marker exists (at most `timeout_s`); true if it waited.
STRATA_API bool wait_for_breakpoint_persist(const std::filesystem::path& flash_dir, double timeout_s);

// Returns slots a killed supervisor left Persisting to Valid (in `dir` and the node stores inside
// it); for a supervisor starting.
STRATA_API void release_flash_slots(const std::filesystem::path& dir);

// The images of a set, mapped read-only: images[r] is rank r's checkpoint file.
struct MappedFlashSet {
  std::vector<std::string_view> images;
  std::shared_ptr<const void> mappings;  // keeps them mapped
};
STRATA_API MappedFlashSet map_flash_set(const FlashSet& set);
// The same for any list of slot files: images[i] is slots[i]'s image.
STRATA_API MappedFlashSet map_flash_slots(const std::vector<std::filesystem::path>& slots);

// Writes a set to checkpoints_dir as an ordinary checkpoint (rank files, manifest with SHA-256,
// `latest`, the newest `keep` kept), while every slot of it is held Persisting. `pause` (fault
// injection) is slept before publishing. Returns the bytes written; throws UserError when a slot
// changed before it could be held, fails its checksum, or the disk refuses.
STRATA_API uint64_t persist_flash_set(const FlashSet& set, const std::filesystem::path& checkpoints_dir, int64_t keep,
                                      double pause_seconds = 0);

// "step_00000012": the directory of a step's checkpoint inside checkpoints/ (core writes them, the
// supervisor reads them).
STRATA_API std::string step_dir_name(int64_t step);

// Where replicas go ([job] snapshot_replicas = R, core/src/engine/snapshot_replicas.h): given
// every rank's node, receivers[r] are the ranks that hold rank r's images besides its own node:
// the rank with r's index within its node (modulo their size) on each of the next R nodes of the
// ring of nodes in ascending order. A UserError when there are fewer than R + 1 nodes.
STRATA_API std::vector<std::vector<int>> replica_receivers(const std::vector<int64_t>& node_of, int64_t replicas);
// Why `replicas` replicas of each node's snapshot do not fit on `nodes` nodes (each needs its own
// other node: "[job] snapshot_replicas = R needs R + 1 nodes or more; this job's ranks are on K
// nodes"), or empty. replica_receivers and the supervisor after a node shrink ask it.
STRATA_API std::string replica_nodes_problem(int64_t nodes, int64_t replicas);

// The 64-bit checksum of the slots (exposed for its unit test).
STRATA_API uint64_t flash_checksum(const void* data, size_t bytes);

}  // namespace strata
