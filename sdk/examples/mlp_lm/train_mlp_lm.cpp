// A program that keeps its own model (mlp_lm_model.h) and hands Strata the "how": the strategy
// file named on the command line, with `key=value` overrides after it. Under `mpirun -n N` every
// rank runs this same program. Rank 0 prints the last step's loss with 17 digits. With
// --automatic, the file holds only what the program fixes (no [parallel], no passes) and Strata
// picks the rest for the ranks started (Strategy::automatic: the cost model's best candidates
// measured here, the fastest taken); rank 0 prints what it chose.
//
//   train_mlp_lm [--automatic] strategy.toml [section.key=value ...]
#include <cstdio>
#include <iostream>
#include <string>

#include "mlp_lm_model.h"
#include "strata/accelerate.h"
#include "strata/core/launch_env.h"
#include "strata/errors.h"

int main(int argc, char** argv) {
  const bool automatic = argc > 1 && std::string(argv[1]) == "--automatic";
  const int first = automatic ? 2 : 1;
  if (argc <= first) {
    std::cerr << "usage: train_mlp_lm [--automatic] STRATEGY [section.key=value ...]\n";
    return 2;
  }
  const strata::LaunchEnv env = strata::detect_launch_env();
  strata::Strategy strategy;
  try {
    strategy = strata::Strategy::from_file(argv[first]);
    if (automatic) strategy = strata::Strategy::automatic(env.world_size, strategy.text());
    for (int i = first + 1; i < argc; ++i) strategy.set(argv[i]);
  } catch (const strata::UserError& e) {  // an unreadable file: one line, once, exit status 2
    if (env.rank == 0) std::cerr << "train_mlp_lm: " << e.what() << "\n";
    return 2;
  }
  strata::Accelerated result = strata::accelerate(std::make_unique<mlp_lm::MlpLanguageModel>(), {}, nullptr, {}, strategy);
  if (!result.ok) {
    if (env.rank == 0) std::cerr << "train_mlp_lm: " << result.status << "\n";  // once, not per rank
    return 2;
  }
  if (automatic && env.rank == 0) std::printf("%s\n", result.status.c_str());
  const strata::RunSummary summary = result.trainer->run();
  if (result.trainer->job().topology->rank() == 0)
    std::printf("last step %lld loss %.17g\n", static_cast<long long>(summary.last_step), summary.last_loss);
  return 0;
}
