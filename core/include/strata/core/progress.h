// Progress each rank publishes for the supervisor's hang detection (launcher/supervisor.h): a
// small memory-mapped file per rank in $STRATA_PROGRESS_DIR, updated at every stage boundary of
// a step with plain stores (no system call per beat). The file also holds the rank's flight
// recorder: its communicator groups and a ring of its last collectives, each with a sequence
// number within its group and whether it completed (core/flight_recorder.h). The supervisor
// reads the files; when no rank's beat counter moves within the deadline, the flight records
// name the collective the others wait in and the ranks that never reached it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "strata/export.h"

namespace strata {

// Where a rank is within its step, in order.
enum class StepPhase : int32_t {
  StartingUp,  // from the rank's start to its first step: building the job, loading a checkpoint
  Starting,
  BatchesReady,
  GradientsDone,
  Clipped,
  Updated,
  Evaluating,
  Checkpointing,
  Finished
};

// Where the checkpoint an attempt resumed from was read.
// PeerMemory: the rank's own image came from a replica in another node's memory
// ([job] snapshot_replicas; ProgressRecord::restored_peer_node names the node).
enum class RestoreSource : int32_t { None = 0, Disk = 1, Memory = 2, PeerMemory = 3 };
STRATA_API const char* step_phase_name(StepPhase phase);

struct ProgressRecord {
  int64_t beats = 0;  // changes at every update
  int64_t step = 0;
  int32_t phase = 0;  // StepPhase
  int32_t pid = 0;
  // For the goodput breakdown: what this attempt of the rank spent blocked in checkpoints, and
  // loading the checkpoint it resumed from.
  int64_t checkpoint_ns = 0;
  int64_t replica_ns = 0;  // of which sending and receiving snapshot replicas ([job] snapshot_replicas)
  int64_t restore_ns = 0;
  int32_t restored_from = 0;  // RestoreSource
  int32_t groups = 0;         // entries of the group table in use
  int32_t micro = -1;         // the micro-batch whose forward (or backward) runs, -1 outside them
  int32_t micro_backward = 0; // 1: in its backward
  int32_t restored_peer_node = -1;  // with RestoreSource::PeerMemory: the node whose memory held it
  int64_t collectives = 0;    // collectives issued so far; the newest is flight[(collectives - 1) % kFlightLength]
  int64_t restored_step = -1; // the step restored (set_restore), -1 when none was
  // Written by the supervisor, never by the rank (request_stop): stop once this many steps are
  // done, save and exit (a Ctrl-C or SIGTERM to `strata run -n N`); 0: run on.
  int64_t stop_after = 0;
};

enum class CollectiveOp : int32_t { AllReduce, ReduceScatter, AllGather, Broadcast, AllToAll, Send, Recv, BatchP2P, Barrier };
STRATA_API const char* collective_op_name(CollectiveOp op);

// A communicator group as a rank knows it. Two ranks hold the same group when its members' hash
// and its ordinal (how many groups with the same members the rank created before it, in program
// order) agree.
struct FlightGroup {
  char name[96] = {};  // "data: ranks 0,2", truncated for large groups
  uint64_t members_hash = 0;
  int32_t ordinal = 0;
  int32_t size = 0;
};

// One operation a rank issued on a group.
struct CollectiveRecord {
  int64_t seq = 0;        // within its group, from 1; 0: an empty slot
  int64_t step = 0;       // the step the rank was in
  int64_t bytes = 0;      // this rank's payload
  int64_t issued_ns = 0;  // CLOCK_REALTIME
  int64_t done_ns = 0;    // when wait() returned; 0 while pending
  int32_t group = 0;      // index into the group table
  int32_t op = 0;         // CollectiveOp
  int32_t peer = -1;      // send and recv: the peer's global rank
  int32_t collective = 0; // 1: numbered among the group's collectives; 0: point to point, numbered apart
};

constexpr int kFlightGroups = 32;
constexpr int kFlightLength = 256;

// The whole progress file.
struct ProgressFile {
  ProgressRecord progress;
  FlightGroup groups[kFlightGroups];
  CollectiveRecord flight[kFlightLength];
};

// The writer, one per rank; inert when $STRATA_PROGRESS_DIR is unset (no supervisor).
class STRATA_API ProgressBeacon {
 public:
  explicit ProgressBeacon(int rank);
  ~ProgressBeacon();
  ProgressBeacon(const ProgressBeacon&) = delete;
  ProgressBeacon& operator=(const ProgressBeacon&) = delete;
  void beat(int64_t step, StepPhase phase);
  // Progress within the phase already reported (an evaluation's batch, a checkpoint's 64 MiB):
  // a long evaluation or save is not a hang.
  void beat();
  // Within the gradient phase: the micro-batch whose forward or backward starts (a beat too).
  void beat_micro(int64_t micro, bool backward);
  // `replica_seconds`: the part of it spent on snapshot replicas.
  void add_checkpoint_time(double seconds, double replica_seconds = 0);
  void set_restore(double seconds, RestoreSource source, int64_t step, int peer_node = -1);
  // The supervisor's stop request (ProgressRecord::stop_after), 0 when none or no supervisor.
  int64_t stop_after() const;

  // The flight recorder (used by core/flight_recorder.h's recording communicator). add_group
  // returns the group's index, or -1 when the table is full or there is no supervisor.
  bool recording() const { return file_ != nullptr; }
  int add_group(const std::string& name, uint64_t members_hash, int size);
  void rename_group(int group, const std::string& name);
  // Records an operation as issued; returns a ticket for collective_done, or -1.
  int64_t collective_issued(int group, int64_t seq, CollectiveOp op, int64_t bytes, int peer, bool collective);
  void collective_done(int64_t ticket);

 private:
  ProgressFile* file_ = nullptr;
  ProgressRecord* record_ = nullptr;
};

STRATA_API std::filesystem::path progress_file(const std::filesystem::path& dir, int rank);
// The record a rank last published, if its file exists and is complete.
STRATA_API bool read_progress(const std::filesystem::path& dir, int rank, ProgressRecord& out);
// The supervisor's side of a graceful stop: asks the rank to stop once `steps` are done. False
// when the rank's file is not there (the rank has not started).
STRATA_API bool request_stop(const std::filesystem::path& dir, int rank, int64_t steps);
// The whole file: progress, groups and flight ring. Entries may be mid-update (the rank runs on):
// readers treat the ring as a hint, ordering entries by issue time.
STRATA_API bool read_progress_file(const std::filesystem::path& dir, int rank, ProgressFile& out);

}  // namespace strata
