// Progress each rank publishes for the supervisor's hang detection (launcher/supervisor.h): a
// small memory-mapped file per rank in $STRATA_PROGRESS_DIR, updated at every stage boundary of
// a step with plain stores (no system call per beat). The supervisor reads the files; when no
// rank's beat counter moves within the deadline, the ranks furthest behind are the culprits (the
// others wait for them in a collective).
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
enum class RestoreSource : int32_t { None = 0, Disk = 1, Memory = 2 };
STRATA_API const char* step_phase_name(StepPhase phase);

struct ProgressRecord {
  int64_t beats = 0;  // changes at every update
  int64_t step = 0;
  int32_t phase = 0;  // StepPhase
  int32_t pid = 0;
  // For the goodput breakdown: what this attempt of the rank spent blocked in checkpoints, and
  // loading the checkpoint it resumed from.
  int64_t checkpoint_ns = 0;
  int64_t restore_ns = 0;
  int32_t restored_from = 0;  // RestoreSource
  int32_t unused = 0;
};

// The writer, one per rank; inert when $STRATA_PROGRESS_DIR is unset (no supervisor).
class STRATA_API ProgressBeacon {
 public:
  explicit ProgressBeacon(int rank);
  ~ProgressBeacon();
  ProgressBeacon(const ProgressBeacon&) = delete;
  ProgressBeacon& operator=(const ProgressBeacon&) = delete;
  void beat(int64_t step, StepPhase phase);
  void add_checkpoint_time(double seconds);
  void set_restore(double seconds, RestoreSource source);

 private:
  ProgressRecord* record_ = nullptr;
};

STRATA_API std::filesystem::path progress_file(const std::filesystem::path& dir, int rank);
// The record a rank last published, if its file exists and is complete.
STRATA_API bool read_progress(const std::filesystem::path& dir, int rank, ProgressRecord& out);

}  // namespace strata
