#include "strata/core/run_directory.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <vector>

#include "strata/errors.h"

namespace strata {

namespace fs = std::filesystem;

namespace {

constexpr const char* kLockFile = ".strata.lock";

// What a run writes into its directory; nothing else is ever removed. The supervisor adds a
// flight_record_attempt_N.json for each hang.
bool is_run_file(const std::string& name) {
  static const std::set<std::string> names{"strategy.toml", "metrics.jsonl", "events.jsonl", "checkpoints", "logs", "tensorboard"};
  auto numbered = [&](const std::string& prefix, const std::string& suffix) {
    return name.rfind(prefix, 0) == 0 && name.size() > prefix.size() + suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return names.count(name) > 0 || numbered("flight_record_attempt_", ".json") || numbered("profile_rank", ".md");
}

std::string pid_in(int fd) {
  char buffer[32] = {};
  const ssize_t n = ::pread(fd, buffer, sizeof buffer - 1, 0);
  std::string pid(buffer, n > 0 ? static_cast<size_t>(n) : 0);
  pid.erase(std::remove(pid.begin(), pid.end(), '\n'), pid.end());
  return pid.empty() ? "unknown" : pid;
}

}  // namespace

bool holds_a_run(const fs::path& dir) {
  std::error_code e;
  return fs::exists(dir / kLockFile, e) ||
         (fs::exists(dir / "strategy.toml", e) && (fs::exists(dir / "metrics.jsonl", e) || fs::exists(dir / "checkpoints", e)));
}

RunDirectoryClaim::RunDirectoryClaim(const fs::path& dir, bool resume, bool overwrite) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) throw UserError("cannot create the run directory " + dir.string() + ": " + ec.message());
  const fs::path lock = dir / kLockFile;
  lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (lock_fd_ < 0) throw UserError("cannot open " + lock.string() + ": " + std::strerror(errno));
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    const std::string pid = pid_in(lock_fd_);
    ::close(lock_fd_);
    throw UserError("run directory " + dir.string() + " is in use by another strata run (pid " + pid +
                    "); wait for it to finish or choose another --out");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(lock_fd_, 0) != 0 || ::pwrite(lock_fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    ::close(lock_fd_);
    throw UserError("cannot write " + lock.string() + ": " + std::strerror(errno));
  }

  std::vector<std::string> ours, foreign;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name == kLockFile) continue;
    (is_run_file(name) ? ours : foreign).push_back(name);
  }
  std::sort(ours.begin(), ours.end());
  std::sort(foreign.begin(), foreign.end());
  auto listed = [](const std::vector<std::string>& names) {
    std::string out;
    for (size_t i = 0; i < names.size() && i < 3; ++i) out += (i ? ", " : "") + names[i];
    return names.size() > 3 ? out + ", ..." : out;
  };
  if (!foreign.empty()) {
    ::close(lock_fd_);
    throw UserError("run directory " + dir.string() + " holds files that are not a strata run's (" + listed(foreign) +
                    "); choose an empty or new --out");
  }
  // Progress a new run would destroy: recorded steps and checkpoints. A run that stopped before
  // its first step left only strategy.toml, logs and an empty metrics file: a new run replaces them.
  auto holds_something = [&dir](const char* name) {
    std::error_code e;
    return fs::exists(dir / name, e) && !fs::is_empty(dir / name, e) && !e;
  };
  const bool has_progress = holds_something("metrics.jsonl") || holds_something("checkpoints");
  if (ours.empty() || resume) return;
  if (has_progress && !overwrite) {
    ::close(lock_fd_);
    throw UserError("run directory " + dir.string() + " already holds a run (" + listed(ours) +
                    "); continue it with --resume, or replace it with --overwrite");
  }
  for (const auto& name : ours)
    if (fs::remove_all(dir / name, ec); ec) {
      ::close(lock_fd_);
      throw UserError("cannot remove " + (dir / name).string() + " (--overwrite): " + ec.message());
    }
}

RunDirectoryClaim::~RunDirectoryClaim() {
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

}  // namespace strata
