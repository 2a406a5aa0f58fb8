// Telling a rank the kernel's out-of-memory killer ended from one killed by anything else: both
// die by SIGKILL, and mpirun reports "exited on signal 9 (Killed)" either way, which leaves a user
// to guess. The kernel counts its OOM kills: per memory cgroup (v2 memory.events, v1
// memory.oom_control: "oom_kill N") and for the whole machine (/proc/vmstat "oom_kill", Linux
// 4.13+, which also counts other jobs' kills: read only where no cgroup count is). The supervisor
// reads them before and after an attempt; a rank dead of SIGKILL while the count rose was the OOM
// killer's (its own SIGKILLs, of hung ranks, are named as hangs instead).
#pragma once

#include <cstdint>
#include <string>

namespace strata::cli {

struct OomKillCount {
  int64_t cgroup = -1;   // this process's memory cgroup's count; -1 when unreadable
  int64_t machine = -1;  // /proc/vmstat's; -1 when unreadable
  std::string cgroup_file;      // where `cgroup` was read
  int64_t cgroup_limit_mb = -1;  // the cgroup's memory limit, -1 when none
};

OomKillCount read_oom_kills();

// "rank 1 exited on signal 9 (Killed)" with the counts before and after its attempt: the same
// cause naming the OOM killer, where the kills counted rose; else `cause` as it is.
std::string name_oom_kill(const std::string& cause, const OomKillCount& before, const OomKillCount& after);

}  // namespace strata::cli
