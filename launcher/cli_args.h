// Command-line parsing for the strata command.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::cli {

struct Args {
  std::string command;                  // "plan", "plugins", ...; empty for bare `strata`
  std::vector<std::string> positional;  // after the command
  std::vector<std::string> sets;        // --set section.key=value
  std::vector<std::string> disables;    // --disable NAME
  int64_t ranks = 1;                    // -n N
  int64_t simulate_nodes = 0;           // run: --simulate-nodes K; 0 = the machine is one node
  std::string output;                   // -o FILE
  std::string out_dir;                  // --out DIR
  bool resume = false;
  bool overwrite = false;
  bool json = false;
  bool help = false;
  bool version = false;
  bool verbose = false;
  bool dry_run = false;                 // tune: rank the candidates without measuring
  bool finetune = false;                // tune: search only around the complete strategy given
  bool remeasure = false;               // tune: measure rates and trials again, ignoring the cache
  double memory_gb = 0;                 // tune: bytes per rank allowed, in GiB; 0 = no limit
  int64_t top = 0;                      // tune: candidates shown (dry run) or measured; 0 = the command's default
  int64_t rounds = 0;                   // tune: trials of each near tie; 0 = the default
  double budget_s = 0;                  // tune: wall time for measured trials; 0 = no limit
  int64_t trial_warmup_steps = 2;       // tune: --trial-steps W+M, each trial's discarded steps
  int64_t trial_measured_steps = 4;     //   and the steps whose median is its step time
  std::string prompt;                   // sample: the text to continue
  int64_t sample_tokens = 100;          // sample: tokens to generate
  double temperature = 0.8;             // sample: 0 = greedy
  int64_t top_k = 0;                    // sample: 0 = every token
  int64_t seed = 0;                     // sample: the sampling generator's seed
  std::string tokenizer;                // data prepare: a Hugging Face tokenizer.json
  int64_t train_tokenizer = 0;          // data prepare: vocabulary of a BPE trained on the corpus; 0 = none
  std::string text_field = "text";      // data prepare: the JSON Lines / Parquet field holding the text
  double val_fraction = 0.05;           // data prepare: documents held out for validation
  std::string eos;                      // data prepare: the end-of-text token; empty = the tokenizer's usual one
  std::string dtype;                    // ckpt export: the weights' dtype (fp32, bf16, fp16); empty = fp32
  uint64_t max_shard_bytes = 5'000'000'000;  // ckpt export: the largest weight file (strata::ExportOptions)
  int argc = 0;  // the raw command line, for commands that re-execute themselves
  char** argv = nullptr;
  std::vector<std::string> given;  // option names as typed, to refuse those a command does not take
};

// Throws UserError for an unknown option or a missing value.
Args parse_args(int argc, char** argv);

// UserError when `args` holds an option that `command` does not take.
void allow_only(const Args& args, const std::vector<std::string>& options);

}  // namespace strata::cli
