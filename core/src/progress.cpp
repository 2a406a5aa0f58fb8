#include "strata/core/progress.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>

namespace strata {

const char* step_phase_name(StepPhase phase) {
  switch (phase) {
    case StepPhase::StartingUp: return "starting up";
    case StepPhase::Starting: return "starting the step";
    case StepPhase::BatchesReady: return "computing gradients";
    case StepPhase::GradientsDone: return "clipping gradients";
    case StepPhase::Clipped: return "in the optimizer step";
    case StepPhase::Updated: return "reporting the step";
    case StepPhase::Evaluating: return "evaluating";
    case StepPhase::Checkpointing: return "checkpointing";
    case StepPhase::Finished: return "finished";
  }
  return "?";
}

std::filesystem::path progress_file(const std::filesystem::path& dir, int rank) { return dir / ("rank_" + std::to_string(rank)); }

ProgressBeacon::ProgressBeacon(int rank) {
  const char* dir = std::getenv("STRATA_PROGRESS_DIR");
  if (!dir) return;
  const int fd = ::open(progress_file(dir, rank).c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return;  // no hang detection for this rank; training goes on
  if (::ftruncate(fd, sizeof(ProgressRecord)) == 0) {
    void* map = ::mmap(nullptr, sizeof(ProgressRecord), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map != MAP_FAILED) record_ = static_cast<ProgressRecord*>(map);
  }
  ::close(fd);
  if (record_) record_->pid = static_cast<int32_t>(::getpid());
}

ProgressBeacon::~ProgressBeacon() {
  if (record_) ::munmap(record_, sizeof(ProgressRecord));
}

void ProgressBeacon::beat(int64_t step, StepPhase phase) {
  if (!record_) return;
  record_->step = step;
  record_->phase = static_cast<int32_t>(phase);
  __atomic_store_n(&record_->beats, record_->beats + 1, __ATOMIC_RELEASE);
}

void ProgressBeacon::add_checkpoint_time(double seconds) {
  if (record_) record_->checkpoint_ns += static_cast<int64_t>(seconds * 1e9);
}

void ProgressBeacon::set_restore(double seconds, RestoreSource source) {
  if (!record_) return;
  record_->restore_ns = static_cast<int64_t>(seconds * 1e9);
  record_->restored_from = static_cast<int32_t>(source);
}

bool read_progress(const std::filesystem::path& dir, int rank, ProgressRecord& out) {
  const int fd = ::open(progress_file(dir, rank).c_str(), O_RDONLY);
  if (fd < 0) return false;
  const bool complete = ::pread(fd, &out, sizeof out, 0) == static_cast<ssize_t>(sizeof out);
  ::close(fd);
  return complete;
}

}  // namespace strata
