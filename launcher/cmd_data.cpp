// strata data prepare: a user's own text to the token files the `tokens` dataset reads.
//
// Tokenizing is the field's library, Hugging Face `tokenizers` (Rust, its batch encoder parallel
// over the cores), which lives in Python: this command checks the arguments and the inputs, finds
// a Python that has the library (python_tokenizers.h) and runs launcher/data/prepare_tokens.py
// (installed as share/strata/prepare_tokens.py), which
// writes train.bin, val.bin, tokenizer.json and meta.json. An input may be a directory: its text,
// JSON Lines and Parquet files, at any depth, in path order. A problem is one line and exit status 2.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "commands.h"
#include "common.h"
#include "python_tokenizers.h"
#include "strata/errors.h"

namespace strata::cli {
namespace {

namespace fs = std::filesystem;

volatile pid_t preparing_child = 0;
void forward_to_child(int signal) { ::kill(preparing_child, signal); }

// What prepare_tokens.py reads, by extension (anything else named alone is read as plain text).
const std::vector<std::string> kCorpusExtensions{".txt", ".md", ".jsonl", ".json", ".ndjson", ".parquet"};

// The files a directory input contributes: those of the kinds above, at any depth, in path order
// (hidden files and directories apart, as a corpus's .git is no text). The others are named on
// one line, so that nothing the user gave is left out unsaid.
std::vector<std::string> corpus_files(const std::string& dir) {
  std::vector<fs::path> files, skipped;
  std::error_code error;
  for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, error);
       !error && it != fs::recursive_directory_iterator(); it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (!name.empty() && name[0] == '.') {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file()) continue;
    std::string extension = it->path().extension().string();
    for (char& c : extension) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const bool readable = std::find(kCorpusExtensions.begin(), kCorpusExtensions.end(), extension) != kCorpusExtensions.end();
    (readable ? files : skipped).push_back(it->path());
  }
  if (error) throw UserError("input " + dir + ": cannot list the directory (" + error.message() + ")");
  std::string kinds;
  for (const auto& extension : kCorpusExtensions) kinds += (kinds.empty() ? "" : ", ") + extension;
  if (files.empty()) throw UserError("input " + dir + " holds no file of the kinds strata data prepare reads (" + kinds + ")");
  std::sort(files.begin(), files.end());
  std::sort(skipped.begin(), skipped.end());
  std::cout << "strata data prepare: " << dir << ": " << files.size() << " file" << (files.size() == 1 ? "" : "s") << " read";
  if (!skipped.empty())
    std::cout << ", " << skipped.size() << " skipped (not " << kinds << "; the first: " << skipped.front().string() << ")";
  std::cout << "\n" << std::flush;
  return {files.begin(), files.end()};
}

int run_prepare(const Args& args) {
  allow_only(args, {"-o", "--output", "--tokenizer", "--train-tokenizer", "--text-field", "--val-fraction", "--eos"});
  const std::vector<std::string> named(args.positional.begin() + 1, args.positional.end());
  if (named.empty()) throw UserError("'strata data prepare' needs input files or directories; see strata data --help");
  if (args.output.empty()) throw UserError("'strata data prepare' needs -o DIR, the directory to write");
  if (args.tokenizer.empty() == (args.train_tokenizer == 0))
    throw UserError("'strata data prepare' needs one of --tokenizer FILE (a Hugging Face tokenizer.json) or --train-tokenizer VOCAB_SIZE");
  if (args.train_tokenizer > 0 && args.train_tokenizer < 257)
    throw UserError("--train-tokenizer " + std::to_string(args.train_tokenizer) + ": a byte-level BPE needs a vocabulary above 256 (its bytes and the end-of-text token)");
  std::error_code unreadable;  // a name the system refuses (too long, no permission) is "not a file"
  std::vector<std::string> inputs;
  for (const auto& input : named) {
    if (fs::is_directory(input, unreadable)) {
      const std::vector<std::string> files = corpus_files(input);
      inputs.insert(inputs.end(), files.begin(), files.end());
    } else if (fs::is_regular_file(input, unreadable)) {
      inputs.push_back(input);
    } else {
      throw UserError("input " + input + " is not a file or a directory");
    }
  }
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
  if (child < 0) throw UserError("strata data prepare: cannot start " + argv[0]);
  // Until the child ends: a terminal's Ctrl-C reaches it too (one process group), and SIGTERM is
  // passed on to it, so that it removes its temporary files and says so; this process waits.
  preparing_child = child;
  struct sigaction ignore {}, forward {}, old_int {}, old_term {};
  ignore.sa_handler = SIG_IGN;
  forward.sa_handler = forward_to_child;
  ::sigaction(SIGINT, &ignore, &old_int);
  ::sigaction(SIGTERM, &forward, &old_term);
  int status = 0;
  pid_t waited;
  while ((waited = waitpid(child, &status, 0)) < 0 && errno == EINTR) {
  }
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  if (waited < 0) throw UserError("strata data prepare: cannot wait for " + argv[0]);
  if (WIFEXITED(status)) {
    const int code = WEXITSTATUS(status);
    return code == 0 || code == 2 || code == 130 ? code : 1;
  }
  return WIFSIGNALED(status) && (WTERMSIG(status) == SIGINT || WTERMSIG(status) == SIGTERM) ? 130 : 1;
}

}  // namespace

int run_data(const Args& args) {
  if (args.positional.empty() || args.positional[0] != "prepare")
    throw UserError("'strata data' takes a subcommand: prepare; see strata data --help");
  return run_prepare(args);
}

}  // namespace strata::cli
