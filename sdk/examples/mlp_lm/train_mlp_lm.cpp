// A program that keeps its own model (mlp_lm_model.h) and hands Strata the "how": the strategy
// file named on the command line, with `key=value` overrides after it. Under `mpirun -n N` every
// rank runs this same program. Rank 0 prints the last step's loss with 17 digits.
//
//   train_mlp_lm strategy.toml [section.key=value ...]
#include <cstdio>
#include <iostream>

#include "mlp_lm_model.h"
#include "strata/accelerate.h"
#include "strata/core/launch_env.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: train_mlp_lm STRATEGY [section.key=value ...]\n";
    return 2;
  }
  strata::Strategy strategy = strata::Strategy::from_file(argv[1]);
  for (int i = 2; i < argc; ++i) strategy.set(argv[i]);
  strata::Accelerated result = strata::accelerate(std::make_unique<mlp_lm::MlpLanguageModel>(), {}, nullptr, {}, strategy);
  if (!result.ok) {
    if (strata::detect_launch_env().rank == 0) std::cerr << "train_mlp_lm: " << result.status << "\n";  // once, not per rank
    return 2;
  }
  const strata::RunSummary summary = result.trainer->run();
  if (result.trainer->job().topology->rank() == 0)
    std::printf("last step %lld loss %.17g\n", static_cast<long long>(summary.last_step), summary.last_loss);
  return 0;
}
