// strata run: train with a strategy, here or on N local ranks started through mpirun.
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "commands.h"
#include "strata/core/launch_env.h"
#include "strata/core/trainer.h"
#include "strategy_input.h"

namespace strata::cli {

namespace {

// Replaces this process with `mpirun -np N strata run ...` (the same arguments but -n). Local
// launches oversubscribe (more ranks than cores is fine for tests) and do not bind ranks to
// cores; as root, mpirun needs to be told that is intended.
[[noreturn]] void relaunch_under_mpirun(int argc, char** argv, int64_t ranks) {
  std::vector<std::string> words{"mpirun", "-np", std::to_string(ranks), "--oversubscribe", "--bind-to", "none"};
  if (::geteuid() == 0) words.push_back("--allow-run-as-root");
  words.push_back(std::filesystem::read_symlink("/proc/self/exe").string());
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-n" || arg == "--ranks") {
      ++i;
      continue;
    }
    if (arg.rfind("--ranks=", 0) == 0) continue;
    words.push_back(arg);
  }
  std::vector<char*> exec_args;
  for (auto& w : words) exec_args.push_back(w.data());
  exec_args.push_back(nullptr);
  ::execvp("mpirun", exec_args.data());
  throw UserError("cannot start mpirun (is openmpi-bin installed?): " + std::string(std::strerror(errno)));
}

}  // namespace

int run_train(const Args& args) {
  allow_only(args, {"--set", "--disable", "--out", "--resume", "-n", "--ranks"});
  const LaunchEnv env = detect_launch_env();
  if (args.ranks > 1 && env.world_size == 1) {
    // Check the strategy once here, so that bad input is reported once and starts no ranks.
    ComponentRegistry registry;
    LoadedPlan checked;
    if (!load_plan(args, args.ranks, registry, checked)) return 2;
    relaunch_under_mpirun(args.argc, args.argv, args.ranks);
  }
  if (args.ranks > 1 && args.ranks != env.world_size)
    throw UserError("-n " + std::to_string(args.ranks) + " but the launcher started " + std::to_string(env.world_size) + " ranks");
  ComponentRegistry registry;
  LoadedPlan loaded;
  if (!load_plan(args, env.world_size, registry, loaded)) return 2;
  run_training(loaded.plan, loaded.order, registry, RunOptions{args.out_dir, args.resume});
  return 0;
}

}  // namespace strata::cli
