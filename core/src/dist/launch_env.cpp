#include "strata/core/launch_env.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "strata/errors.h"

namespace strata {

namespace {

bool read_int(const char* name, int& out) {
  const char* value = std::getenv(name);
  if (!value || !*value) return false;
  char* end = nullptr;
  long parsed = std::strtol(value, &end, 10);
  if (*end != '\0' || parsed < 0) throw UserError(std::string("environment variable ") + name + "=" + value + " is not a rank number");
  out = static_cast<int>(parsed);
  return true;
}

// Slurm's tasks per node, "2(x3),1" (three nodes with 2 tasks, then one with 1): the count of
// node `node`, or -1 when the text is not in that form or has no such node.
int slurm_tasks_on_node(const std::string& text, int node) {
  std::istringstream in(text);
  int seen = 0;
  for (std::string entry; std::getline(in, entry, ',');) {
    int tasks = 0, repeat = 1;
    char tail[2] = {0, 0};
    const int parsed = std::sscanf(entry.c_str(), "%d(x%d%1[)]", &tasks, &repeat, tail);
    if (parsed != 1 && !(parsed == 3 && tail[0] == ')')) return -1;
    if (node < seen + repeat) return tasks;
    seen += repeat;
  }
  return -1;
}

}  // namespace

bool restarted_by_torchelastic(const LaunchEnv& env) {
  const char* count = std::getenv("TORCHELASTIC_RESTART_COUNT");
  return env.launcher == "torchrun" && count && std::string(count) != "0" && std::string(count) != "";
}

LaunchEnv detect_launch_env() {
  LaunchEnv env;
  if (read_int("OMPI_COMM_WORLD_RANK", env.rank) && read_int("OMPI_COMM_WORLD_SIZE", env.world_size)) {
    env.launcher = "openmpi";
    read_int("OMPI_COMM_WORLD_LOCAL_RANK", env.local_rank);
    read_int("OMPI_COMM_WORLD_LOCAL_SIZE", env.local_size);
  } else if (read_int("SLURM_PROCID", env.rank) && read_int("SLURM_NTASKS", env.world_size)) {
    env.launcher = "slurm";
    read_int("SLURM_LOCALID", env.local_rank);
    // srun sets SLURM_NTASKS_PER_NODE only when asked for it; the step's layout is always there.
    env.local_size = env.world_size;
    int node = 0;
    read_int("SLURM_NODEID", node);
    const char* per_node = std::getenv("SLURM_STEP_TASKS_PER_NODE");
    if (!per_node) per_node = std::getenv("SLURM_TASKS_PER_NODE");
    if (const int tasks = per_node ? slurm_tasks_on_node(per_node, node) : -1; tasks > 0) env.local_size = tasks;
    else read_int("SLURM_NTASKS_PER_NODE", env.local_size);
  } else if (read_int("PMI_RANK", env.rank) && read_int("PMI_SIZE", env.world_size)) {
    env.launcher = "pmi";
    env.local_size = env.world_size;
  } else if (read_int("RANK", env.rank) && read_int("WORLD_SIZE", env.world_size)) {
    env.launcher = "torchrun";
    read_int("LOCAL_RANK", env.local_rank);
    env.local_size = env.world_size;
    read_int("LOCAL_WORLD_SIZE", env.local_size);
  }
  if (env.rank >= env.world_size)
    throw UserError("launcher environment gives rank " + std::to_string(env.rank) + " of a world of " +
                    std::to_string(env.world_size));
  env.slot = env.local_rank;
  if (const char* slots = std::getenv(kSlotsEnv); slots && *slots) {
    std::vector<int> list;
    std::istringstream in(slots);
    for (std::string one; std::getline(in, one, ',');) list.push_back(std::stoi(one));
    if (static_cast<int>(list.size()) != env.world_size)
      throw UserError(std::string(kSlotsEnv) + "=" + slots + " lists " + std::to_string(list.size()) + " slots for " +
                      std::to_string(env.world_size) + " ranks");
    env.slot = list[static_cast<size_t>(env.rank)];
  }
  // The node: Slurm and torchrun say it (SLURM_NODEID, GROUP_RANK), elsewhere ranks fill nodes in order.
  env.node = env.rank / std::max(1, env.local_size);
  if (env.launcher == "slurm") read_int("SLURM_NODEID", env.node);
  if (env.launcher == "torchrun") read_int("GROUP_RANK", env.node);
  if (const char* nodes = std::getenv(kSimulatedNodesEnv); nodes && std::atoi(nodes) > 0)
    env.node = env.rank / ((env.world_size + std::atoi(nodes) - 1) / std::atoi(nodes));  // a shrunk world keeps K nodes, the last smaller
  return env;
}

void export_torchrun_env(const LaunchEnv& env) {
  ::setenv("RANK", std::to_string(env.rank).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(env.world_size).c_str(), 1);
  ::setenv("LOCAL_RANK", std::to_string(env.local_rank).c_str(), 1);
  ::setenv("LOCAL_WORLD_SIZE", std::to_string(env.local_size).c_str(), 1);
  ::setenv("GROUP_RANK", std::to_string(env.node).c_str(), 1);
}

bool stdout_is_terminal() {
  if (const char* told = std::getenv(kStdoutIsTerminalEnv)) return std::string(told) == "1";
  return ::isatty(STDOUT_FILENO) != 0;
}

int cuda_device_for_slot(int slot, int device_count) { return slot % std::max(1, device_count); }

}  // namespace strata
