// strata ckpt: work with checkpoints.
#include <filesystem>
#include <iostream>

#include "commands.h"
#include "common.h"
#include "strata/core/trainer.h"

namespace strata::cli {

namespace fs = std::filesystem;

int run_ckpt(const Args& args) {
  const bool exporting = !args.positional.empty() && args.positional[0] == "export";
  allow_only(args, exporting ? std::vector<std::string>{"--dtype", "--max-shard-size"} : std::vector<std::string>{});
  if (args.positional.size() == 3 && exporting) {
    ComponentRegistry registry;
    load_plugins(registry);
    const fs::path out = args.positional[2];
    ExportOptions options;
    options.dtype = args.dtype == "bf16" ? at::kBFloat16 : args.dtype == "fp16" ? at::kHalf : at::kFloat;
    options.max_shard_bytes = args.max_shard_bytes;
    const fs::path used = export_hf(args.positional[1], out, registry, options);
    const fs::path index = out / "model.safetensors.index.json";
    std::string weights = "model.safetensors";
    if (fs::exists(index)) {
      size_t files = 0;
      for (const auto& entry : fs::directory_iterator(out)) files += entry.path().extension() == ".safetensors";
      weights = std::to_string(files) + " weight files with model.safetensors.index.json";
    }
    const bool tokenizer = fs::exists(out / "tokenizer.json");
    std::cout << "exported " << used.string() << " to " << out.string() << " (" << weights << " in "
              << (args.dtype.empty() ? "fp32" : args.dtype) << ", config.json" << (tokenizer ? ", tokenizer.json, tokenizer_config.json" : "")
              << ")\n";
    return 0;
  }
  if (args.positional.size() == 3 && args.positional[0] == "consolidate") {
    auto used = consolidate_checkpoint(args.positional[1], args.positional[2]);
    std::cout << "consolidated " << used.string() << " into " << args.positional[2] << "\n";
    return 0;
  }
  if (args.positional.size() == 2 && args.positional[0] == "info") {
    std::cout << describe_checkpoint(args.positional[1]);
    return 0;
  }
  throw UserError("usage: strata ckpt export|consolidate|info ...; see strata ckpt --help");
}

}  // namespace strata::cli
