// strata data prepare: a user's own text to the token files the `tokens` dataset reads.
//
// Tokenizing is the field's library, Hugging Face `tokenizers` (Rust, its batch encoder parallel
// over the cores), which lives in Python: this command checks the arguments and the inputs, finds
// a Python that has the library (python_tokenizers.h) and runs launcher/data/prepare_tokens.py
// (installed as share/strata/prepare_tokens.py), which
// writes train.bin, val.bin, tokenizer.json and meta.json. A problem is one line and exit status 2.
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "commands.h"
#include "common.h"
#include "python_tokenizers.h"
#include "strata/errors.h"

namespace strata::cli {
namespace {

namespace fs = std::filesystem;

int run_prepare(const Args& args) {
  allow_only(args, {"-o", "--output", "--tokenizer", "--train-tokenizer", "--text-field", "--val-fraction", "--eos"});
  const std::vector<std::string> inputs(args.positional.begin() + 1, args.positional.end());
  if (inputs.empty()) throw UserError("'strata data prepare' needs input files; see strata data --help");
  if (args.output.empty()) throw UserError("'strata data prepare' needs -o DIR, the directory to write");
  if (args.tokenizer.empty() == (args.train_tokenizer == 0))
    throw UserError("'strata data prepare' needs one of --tokenizer FILE (a Hugging Face tokenizer.json) or --train-tokenizer VOCAB_SIZE");
  if (args.train_tokenizer > 0 && args.train_tokenizer < 257)
    throw UserError("--train-tokenizer " + std::to_string(args.train_tokenizer) + ": a byte-level BPE needs a vocabulary above 256 (its bytes and the end-of-text token)");
  std::error_code unreadable;  // a name the system refuses (too long, no permission) is "not a file"
  for (const auto& input : inputs)
    if (!fs::is_regular_file(input, unreadable)) throw UserError("input " + input + " is not a file");
  if (!args.tokenizer.empty() && !fs::is_regular_file(args.tokenizer, unreadable)) throw UserError("--tokenizer " + args.tokenizer + " is not a file");
  if (fs::exists(args.output, unreadable) && !fs::is_directory(args.output, unreadable))
    throw UserError("-o " + args.output + " exists and is not a directory");

  std::vector<std::string> argv{tokenizers_python("strata data prepare"), helper_script("prepare_tokens.py").string()};
  argv.insert(argv.end(), inputs.begin(), inputs.end());
  argv.insert(argv.end(), {"--out", args.output, "--text-field", args.text_field, "--val-fraction", std::to_string(args.val_fraction)});
  if (!args.tokenizer.empty()) argv.insert(argv.end(), {"--tokenizer", args.tokenizer});
  if (args.train_tokenizer > 0) argv.insert(argv.end(), {"--train-tokenizer", std::to_string(args.train_tokenizer)});
  if (!args.eos.empty()) argv.insert(argv.end(), {"--eos", args.eos});
  const pid_t child = fork();
  if (child == 0) {
    std::vector<char*> exec_args;
    for (auto& a : argv) exec_args.push_back(a.data());
    exec_args.push_back(nullptr);
    execvp(exec_args[0], exec_args.data());
    _exit(127);
  }
  int status = 0;
  if (child < 0 || waitpid(child, &status, 0) < 0) throw UserError("strata data prepare: cannot start " + argv[0]);
  if (WIFEXITED(status)) return WEXITSTATUS(status) == 0 ? 0 : WEXITSTATUS(status) == 2 ? 2 : 1;
  return 1;
}

}  // namespace

int run_data(const Args& args) {
  if (args.positional.empty() || args.positional[0] != "prepare")
    throw UserError("'strata data' takes a subcommand: prepare; see strata data --help");
  return run_prepare(args);
}

}  // namespace strata::cli
