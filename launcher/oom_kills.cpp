#include "oom_kills.h"

#include <fstream>
#include <sstream>

namespace strata::cli {
namespace {

// "KEY N" lines (memory.events, memory.oom_control, /proc/vmstat): N for `key`, -1 when absent.
int64_t counter(const std::string& file, const std::string& key) {
  std::ifstream in(file);
  std::string name;
  int64_t value = 0;
  while (in >> name >> value)
    if (name == key) return value;
  return -1;
}

// The path of this process's cgroup for `controller` ("" for the v2 hierarchy) from /proc/self/cgroup.
std::string cgroup_path(const std::string& controller) {
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    const size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    std::stringstream controllers(line.substr(first + 1, second - first - 1));
    for (std::string c; std::getline(controllers, c, ',');)
      if (c == controller) return line.substr(second + 1);
    if (controller.empty() && second == first + 1) return line.substr(second + 1);
  }
  return {};
}

// A memory limit file's value in MiB; -1 for none ("max", or v1's near 2^63) or unreadable.
int64_t limit_mb(const std::string& file) {
  std::ifstream in(file);
  uint64_t bytes = 0;
  if (!(in >> bytes) || bytes >= (uint64_t{1} << 62)) return -1;
  return static_cast<int64_t>(bytes >> 20);
}

}  // namespace

OomKillCount read_oom_kills() {
  OomKillCount count;
  count.machine = counter("/proc/vmstat", "oom_kill");
  if (const std::string v1 = cgroup_path("memory"); !v1.empty()) {
    const std::string dir = "/sys/fs/cgroup/memory" + v1;
    count.cgroup = counter(dir + "/memory.oom_control", "oom_kill");
    if (count.cgroup >= 0) {
      count.cgroup_file = dir + "/memory.oom_control";
      count.cgroup_limit_mb = limit_mb(dir + "/memory.limit_in_bytes");
      return count;
    }
  }
  // v2: memory.events.local (Linux 5.2+) counts this cgroup's own kills, where the ranks are;
  // memory.events adds those of the cgroups below (another job's, a test's own).
  const std::string dir = "/sys/fs/cgroup" + cgroup_path("");
  for (const char* file : {"/memory.events.local", "/memory.events"})
    if ((count.cgroup = counter(dir + file, "oom_kill")) >= 0) {
      count.cgroup_file = dir + file;
      break;
    }
  if (count.cgroup >= 0) count.cgroup_limit_mb = limit_mb(dir + "/memory.max");
  return count;
}

std::string name_oom_kill(const std::string& cause, const OomKillCount& before, const OomKillCount& after) {
  const size_t signal = cause.find(" exited on signal 9");
  if (signal == std::string::npos) return cause;
  // The cgroup's count where there is one: the machine's also counts kills in other cgroups (another
  // job's, a sibling test's), which must not be laid on this rank's SIGKILL.
  const bool by_cgroup = before.cgroup >= 0 && after.cgroup > before.cgroup;
  const bool by_machine = before.cgroup < 0 && before.machine >= 0 && after.machine > before.machine;
  if (!by_cgroup && !by_machine) return cause;
  std::ostringstream named;
  named << cause.substr(0, signal) << " was killed by the kernel's out-of-memory killer, the ranks needing more memory than "
        << (after.cgroup_limit_mb > 0 ? "their cgroup's limit of " + std::to_string(after.cgroup_limit_mb) + " MiB"
                                      : std::string("the machine has"))
        << " (signal 9; oom_kill in " << (by_cgroup ? after.cgroup_file : std::string("/proc/vmstat")) << " rose by "
        << (by_cgroup ? after.cgroup - before.cgroup : after.machine - before.machine)
        << "; fsdp, activation checkpointing or a smaller [job] micro_batch need less, and `strata tune` estimates each "
           "layout's memory)";
  return named.str();
}

}  // namespace strata::cli
