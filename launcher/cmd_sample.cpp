// strata sample: a run's newest checkpoint, or a directory transformers' save_pretrained or
// `strata ckpt export` wrote (load_hf_model, through its tokenizer.json), continues a prompt. Byte-level runs (the text
// dataset) are sampled by core (sample_text: the prompt's bytes are its ids); runs on token files
// `strata data prepare` wrote go through their tokenizer.json, with Hugging Face tokenizers in
// Python (python_tokenizers.h) encoding the prompt and decoding the continuation around core's
// token loop (continue_tokens).
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "python_tokenizers.h"
#include "strata/core/prepared_data.h"
#include "strata/core/trainer.h"

namespace strata::cli {
namespace {

namespace fs = std::filesystem;

// The run's tokenizer.json when it trained on a directory `strata data prepare` wrote, else empty.
fs::path prepared_tokenizer(const CheckpointModel& loaded) {
  const Config& data = loaded.plan.data;
  if (!loaded.plan.dataset_component || loaded.plan.dataset_component->name() != "tokens" || !data.has("path")) return {};
  const std::optional<PreparedData> prepared = read_prepared_data(data.get_string("path"));
  return prepared ? prepared->tokenizer : fs::path();
}

// `special`: the prompt gets the tokenizer's special tokens (a hub Llama's BOS), as transformers'
// tokenizer(prompt) adds them for generate; a prepared run's prompt is encoded as its documents were.
std::string sample_through_tokenizer(CheckpointModel& loaded, const fs::path& tokenizer, const SampleOptions& options, bool special) {
  if (options.prompt.empty()) throw UserError("--prompt is empty: give the text to continue");
  const std::string python = tokenizers_python("strata sample");
  std::string pattern = (fs::temp_directory_path() / "strata-sample-XXXXXX").string();  // $TMPDIR, else /tmp
  if (!mkdtemp(pattern.data())) throw UserError("cannot create a temporary directory in " + fs::temp_directory_path().string());
  const fs::path tmp(pattern);
  // Removed however this returns: a tokenizer the helper cannot read throws past the end.
  const std::unique_ptr<const fs::path, void (*)(const fs::path*)> remove_tmp(&tmp, [](const fs::path* dir) {
    std::error_code ignored;
    fs::remove_all(*dir, ignored);
  });
  std::ofstream(tmp / "prompt.txt") << options.prompt;
  const auto ids = nlohmann::json::parse(run_helper(python, "tokenize_text.py", {special ? "encode_special" : "encode", tokenizer.string(), (tmp / "prompt.txt").string()}));
  const std::vector<int64_t> continued = continue_tokens(loaded, ids.get<std::vector<int64_t>>(), options);
  std::ofstream(tmp / "ids.json") << nlohmann::json(continued).dump();
  return run_helper(python, "tokenize_text.py", {"decode", tokenizer.string(), (tmp / "ids.json").string()});
}

}  // namespace

int run_sample(const Args& args) {
  allow_only(args, {"--prompt", "--tokens", "--temperature", "--top-k", "--seed"});
  if (args.positional.size() != 1) throw UserError("usage: strata sample RUN_DIR|CHECKPOINT_DIR|HF_DIR --prompt TEXT; see strata sample --help");
  if (args.prompt.empty()) throw UserError("--prompt is empty: give the text to continue");
  ComponentRegistry registry;
  load_plugins(registry);
  SampleOptions options;
  options.prompt = args.prompt;
  options.tokens = args.sample_tokens;
  options.temperature = args.temperature;
  options.top_k = args.top_k;
  options.seed = static_cast<uint64_t>(args.seed);
  const fs::path source = args.positional[0];
  const bool hf = is_hf_directory(source);
  if (hf && !fs::is_regular_file(source / "tokenizer.json"))
    throw UserError(source.string() + " has no tokenizer.json: strata sample needs the tokenizer its weights' ids come from");
  CheckpointModel loaded = hf ? load_hf_model(source, registry) : load_checkpoint_model(source, registry);
  const fs::path tokenizer = hf ? source / "tokenizer.json" : prepared_tokenizer(loaded);
  std::cout << (tokenizer.empty() ? sample_text(loaded, options) : sample_through_tokenizer(loaded, tokenizer, options, hf)) << std::endl;
  return 0;
}

}  // namespace strata::cli
