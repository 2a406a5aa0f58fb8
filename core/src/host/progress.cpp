#include "strata/core/progress.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <ctime>

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

const char* collective_op_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::AllReduce: return "all_reduce";
    case CollectiveOp::ReduceScatter: return "reduce_scatter";
    case CollectiveOp::AllGather: return "all_gather";
    case CollectiveOp::Broadcast: return "broadcast";
    case CollectiveOp::AllToAll: return "all_to_all";
    case CollectiveOp::Send: return "send";
    case CollectiveOp::Recv: return "recv";
    case CollectiveOp::BatchP2P: return "batch_p2p";
    case CollectiveOp::Barrier: return "barrier";
  }
  return "?";
}

namespace {

int64_t wall_ns() {
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  return static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
}

void copy_name(char (&to)[sizeof(FlightGroup::name)], const std::string& from) {
  const size_t n = std::min(from.size(), sizeof to - 1);
  std::memcpy(to, from.data(), n);
  to[n] = 0;
}

}  // namespace

std::filesystem::path progress_file(const std::filesystem::path& dir, int rank) { return dir / ("rank_" + std::to_string(rank)); }

ProgressBeacon::ProgressBeacon(int rank) {
  const char* dir = std::getenv("STRATA_PROGRESS_DIR");
  if (!dir) return;
  const int fd = ::open(progress_file(dir, rank).c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return;  // no hang detection for this rank; training goes on
  if (::ftruncate(fd, sizeof(ProgressFile)) == 0) {
    void* map = ::mmap(nullptr, sizeof(ProgressFile), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map != MAP_FAILED) file_ = static_cast<ProgressFile*>(map);
  }
  ::close(fd);
  if (!file_) return;
  record_ = &file_->progress;
  record_->pid = static_cast<int32_t>(::getpid());
  record_->restored_step = -1;  // the file starts zeroed, and step 0 is not "none"
}

ProgressBeacon::~ProgressBeacon() {
  if (file_) ::munmap(file_, sizeof(ProgressFile));
}

void ProgressBeacon::beat(int64_t step, StepPhase phase) {
  if (!record_) return;
  record_->step = step;
  record_->phase = static_cast<int32_t>(phase);
  record_->micro = -1;
  __atomic_store_n(&record_->beats, record_->beats + 1, __ATOMIC_RELEASE);
}

void ProgressBeacon::beat() {
  if (record_) __atomic_store_n(&record_->beats, record_->beats + 1, __ATOMIC_RELEASE);
}

void ProgressBeacon::beat_micro(int64_t micro, bool backward) {
  if (!record_) return;
  record_->micro = static_cast<int32_t>(micro);
  record_->micro_backward = backward ? 1 : 0;
  __atomic_store_n(&record_->beats, record_->beats + 1, __ATOMIC_RELEASE);
}

void ProgressBeacon::add_checkpoint_time(double seconds, double replica_seconds) {
  if (!record_) return;
  record_->checkpoint_ns += static_cast<int64_t>(seconds * 1e9);
  record_->replica_ns += static_cast<int64_t>(replica_seconds * 1e9);
}

void ProgressBeacon::set_restore(double seconds, RestoreSource source, int64_t step, int peer_node) {
  if (!record_) return;
  record_->restored_step = step;
  record_->restore_ns = static_cast<int64_t>(seconds * 1e9);
  record_->restored_from = static_cast<int32_t>(source);
  record_->restored_peer_node = peer_node;
}

int64_t ProgressBeacon::stop_after() const { return record_ ? __atomic_load_n(&record_->stop_after, __ATOMIC_ACQUIRE) : 0; }

bool request_stop(const std::filesystem::path& dir, int rank, int64_t steps) {
  const int fd = ::open(progress_file(dir, rank).c_str(), O_RDWR);
  if (fd < 0) return false;
  void* map = ::mmap(nullptr, sizeof(ProgressFile), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return false;
  __atomic_store_n(&static_cast<ProgressFile*>(map)->progress.stop_after, steps, __ATOMIC_RELEASE);
  ::munmap(map, sizeof(ProgressFile));
  return true;
}

int ProgressBeacon::add_group(const std::string& name, uint64_t members_hash, int size) {
  if (!file_ || record_->groups >= kFlightGroups) return -1;
  const int index = record_->groups;
  FlightGroup& group = file_->groups[index];
  copy_name(group.name, name);
  group.members_hash = members_hash;
  group.ordinal = static_cast<int32_t>(std::count_if(file_->groups, file_->groups + index,
                                                     [&](const FlightGroup& g) { return g.members_hash == members_hash; }));
  group.size = size;
  __atomic_store_n(&record_->groups, index + 1, __ATOMIC_RELEASE);
  return index;
}

void ProgressBeacon::rename_group(int group, const std::string& name) {
  if (file_ && group >= 0 && group < record_->groups) copy_name(file_->groups[group].name, name);
}

int64_t ProgressBeacon::collective_issued(int group, int64_t seq, CollectiveOp op, int64_t bytes, int peer, bool collective) {
  if (!file_ || group < 0) return -1;
  // Communicators may be driven from more than one thread: claim the slot atomically.
  const int64_t ticket = __atomic_fetch_add(&record_->collectives, 1, __ATOMIC_ACQ_REL);
  CollectiveRecord& entry = file_->flight[ticket % kFlightLength];
  entry.seq = 0;  // invalid while being filled in
  entry.step = record_->step;
  entry.bytes = bytes;
  entry.issued_ns = wall_ns();
  entry.done_ns = 0;
  entry.group = group;
  entry.op = static_cast<int32_t>(op);
  entry.peer = peer;
  entry.collective = collective ? 1 : 0;
  __atomic_store_n(&entry.seq, seq, __ATOMIC_RELEASE);
  return ticket;
}

void ProgressBeacon::collective_done(int64_t ticket) {
  if (!file_ || ticket < 0) return;
  // The slot has been reused when kFlightLength newer operations were issued meanwhile.
  if (__atomic_load_n(&record_->collectives, __ATOMIC_ACQUIRE) - ticket > kFlightLength) return;
  __atomic_store_n(&file_->flight[ticket % kFlightLength].done_ns, wall_ns(), __ATOMIC_RELEASE);
}

namespace {

// The first `bytes` of rank's progress file into `out`; false when it is missing or shorter.
bool read_progress_prefix(const std::filesystem::path& dir, int rank, void* out, size_t bytes) {
  const int fd = ::open(progress_file(dir, rank).c_str(), O_RDONLY);
  if (fd < 0) return false;
  const bool complete = ::pread(fd, out, bytes, 0) == static_cast<ssize_t>(bytes);
  ::close(fd);
  return complete;
}

}  // namespace

bool read_progress_file(const std::filesystem::path& dir, int rank, ProgressFile& out) {
  return read_progress_prefix(dir, rank, &out, sizeof out);
}

bool read_progress(const std::filesystem::path& dir, int rank, ProgressRecord& out) {
  return read_progress_prefix(dir, rank, &out, sizeof out);
}

}  // namespace strata
