// strata run: train with a strategy.
#include "commands.h"
#include "strata/core/trainer.h"
#include "strategy_input.h"

namespace strata::cli {

int run_train(const Args& args) {
  allow_only(args, {"--set", "--disable", "--out", "--resume"});
  ComponentRegistry registry;
  LoadedPlan loaded;
  if (!load_plan(args, 1, registry, loaded)) return 2;
  run_training(loaded.plan, loaded.order, registry, RunOptions{args.out_dir, args.resume});
  return 0;
}

}  // namespace strata::cli
