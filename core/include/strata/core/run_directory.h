// The run directory's guard: one run at a time in a directory, and never two runs mixed in one.
#pragma once

#include <filesystem>
#include <string>

#include "strata/export.h"

namespace strata {

// Set by `strata run -n N` for the ranks it starts, once it has claimed the run directory for
// them: rank 0 then does not claim it again.
inline constexpr const char* kRunDirectoryClaimedEnv = "STRATA_RUN_DIR_CLAIMED";

// `dir` holds a run: its lock file, or strategy.toml beside metrics.jsonl or checkpoints/ (a
// project folder that merely holds a strategy.toml is not one). Such a directory holds only what
// runs write: RunDirectoryClaim refuses one with anything else inside.
STRATA_API bool holds_a_run(const std::filesystem::path& dir);

// Holds an exclusive lock on a run directory while it lives.
class STRATA_API RunDirectoryClaim {
 public:
  // Creates `dir` if needed and locks it (flock on `dir`/.strata.lock, which records the pid): a
  // second run into the same directory is refused, naming the first's pid. Then, unless `resume`
  // continues the run it holds, refuses a directory holding a run's progress (metrics.jsonl,
  // checkpoints/) and otherwise removes the run files Strata writes (strategy.toml,
  // metrics.jsonl, checkpoints/, logs/); `overwrite` removes them even with progress. Files that
  // are not a run's are never removed: a directory holding any is refused either way.
  RunDirectoryClaim(const std::filesystem::path& dir, bool resume, bool overwrite);
  ~RunDirectoryClaim();
  RunDirectoryClaim(const RunDirectoryClaim&) = delete;
  RunDirectoryClaim& operator=(const RunDirectoryClaim&) = delete;

 private:
  int lock_fd_ = -1;
};

}  // namespace strata
