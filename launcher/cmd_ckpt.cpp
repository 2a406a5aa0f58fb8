// strata ckpt: work with checkpoints.
#include <iostream>

#include "commands.h"
#include "common.h"
#include "strata/core/trainer.h"

namespace strata::cli {

int run_ckpt(const Args& args) {
  allow_only(args, {});
  if (args.positional.size() == 3 && args.positional[0] == "export") {
    ComponentRegistry registry;
    load_plugins(registry);
    auto used = export_hf(args.positional[1], args.positional[2], registry);
    std::cout << "exported " << used.string() << " to " << args.positional[2] << " (model.safetensors, config.json)\n";
    return 0;
  }
  throw UserError("usage: strata ckpt export RUN_DIR|CHECKPOINT_DIR OUT_DIR; see strata ckpt --help");
}

}  // namespace strata::cli
