// strata sample: a run's newest checkpoint continues a prompt (sample_text in core).
#include <iostream>

#include "commands.h"
#include "common.h"
#include "strata/core/trainer.h"

namespace strata::cli {

int run_sample(const Args& args) {
  allow_only(args, {"--prompt", "--tokens", "--temperature", "--top-k", "--seed"});
  if (args.positional.size() != 1) throw UserError("usage: strata sample RUN_DIR|CHECKPOINT_DIR --prompt TEXT; see strata sample --help");
  ComponentRegistry registry;
  load_plugins(registry);
  SampleOptions options;
  options.prompt = args.prompt;
  options.tokens = args.sample_tokens;
  options.temperature = args.temperature;
  options.top_k = args.top_k;
  options.seed = static_cast<uint64_t>(args.seed);
  std::cout << sample_text(args.positional[0], options, registry) << std::endl;
  return 0;
}

}  // namespace strata::cli
