#include "fault_injection.h"

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <thread>

#include <c10/util/Exception.h>

#include "strata/core/flash_checkpoint.h"
#include "strata/core/launch_env.h"

namespace strata::engine {

namespace {

// A lost node: its snapshot store goes with it, then this rank (the supervisor's mpirun takes
// the node's other ranks, and every other rank, down with it).
[[noreturn]] void lose_this_node(int node) {
  if (const char* flash = std::getenv("STRATA_FLASH_DIR")) {
    std::error_code ignored;
    std::filesystem::remove_all(flash_node_store(flash, node), ignored);
  }
  std::raise(SIGKILL);
  std::abort();
}

}  // namespace

bool inject_fault(int rank, int64_t step, const std::string& point, const std::function<void()>& before_kill) {
  const char* fault = std::getenv("STRATA_FAULT");
  if (!fault) return false;
  // The attempt: strata run -n N's, or torchelastic's for a worker group torchrun restarted.
  const char* attempt_text = std::getenv("STRATA_RESTART_COUNT");
  if (!attempt_text) attempt_text = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const int attempt = attempt_text ? std::atoi(attempt_text) : 0;
  const bool every_attempt = std::getenv("STRATA_FAULT_EVERY_ATTEMPT") != nullptr;
  std::istringstream faults(fault);
  for (std::string one; std::getline(faults, one, ';');) {
    std::istringstream in(one);
    std::string kind, qualifier;
    int fault_rank = -1;
    int64_t fault_step = -1;
    if (!(in >> kind >> fault_rank >> fault_step) || fault_step != step) continue;
    // "@K": in attempt K only; else the first attempt, or every one with STRATA_FAULT_EVERY_ATTEMPT.
    const bool qualified = static_cast<bool>(in >> qualifier) && qualifier.size() > 1 && qualifier[0] == '@';
    if (qualified ? std::atoi(qualifier.c_str() + 1) != attempt : attempt != 0 && !every_attempt) continue;
    if ((point == "step" && kind == "lose_node") || (point == "replica" && kind == "lose_node_in_replica")) {
      const LaunchEnv env = detect_launch_env();
      if (env.node == fault_rank) lose_this_node(env.node);
      continue;
    }
    if (fault_rank != rank) continue;
    if (point == "step" && kind == "kill") {
      if (before_kill) before_kill();
      std::raise(SIGKILL);
    }
    if (point == "step" && kind == "stop") std::raise(SIGSTOP);
    // An error from inside libtorch, C++ backtrace and all: what a user sees must be one line.
    if (point == "step" && kind == "torch_error") TORCH_CHECK(false, "injected fault: a libtorch error at step ", step);
    if (point == "backward" && kind == "stop_in_backward") std::raise(SIGSTOP);
    if (point == "snapshot" && kind == "kill_in_snapshot") std::raise(SIGKILL);
    if (point == "replica" && kind == "kill_in_replica") std::raise(SIGKILL);
    if (point == "export" && kind == "kill_in_export") std::raise(SIGKILL);
    if (point == "snapshot_done" && kind == "corrupt_snapshot") return true;
    if ((point == "evaluation" && kind == "slow_evaluation") || (point == "checkpoint" && kind == "slow_checkpoint") ||
        (point == "restore" && kind == "slow_restore"))
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return false;
}

}  // namespace strata::engine
