// The strata command.
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "strata/core/log.h"
#include "strata/core/process_memory.h"
#include "strata/core/version.h"
#include "strata/errors.h"

namespace strata::cli {

const std::vector<Command>& commands() {
  static const std::vector<Command> list{
      {"plugins", "List loaded plugins, their components and where they came from",
       "usage: strata plugins [--json]\n\n"
       "Loads every plugin on the search path (STRATA_PLUGIN_PATH, then the installed plugin\n"
       "directory) and lists each plugin's version, file and registered components.\n\n"
       "  --json    machine-readable output\n",
       run_plugins},
      {"plan", "Resolve a strategy and print the configuration and pass order",
       "usage: strata plan STRATEGY.toml [-n N] [--set section.key=value]... [--disable PASS]... [--json]\n\n"
       "Checks the strategy against the declared keys of core and of the components it names,\n"
       "orders the enabled passes, and prints the result, or every error found (exit status 2).\n\n"
       "  -n, --ranks N        world size to plan for (default 1)\n"
       "  --set S.K=V          override a key: job.steps=10, model.n_layer=4, pass.fsdp.min_params=1000\n"
       "  --disable PASS       switch a pass off, as enabled = false does\n"
       "  --json               machine-readable output\n",
       run_plan},
      {"tune", "Find the fastest strategy for N ranks: search, predict, measure the best few, write the winner",
       "usage: strata tune STRATEGY.toml -n N [--memory-gb G] [--top K] [--rounds R] [--trial-steps W+M] [--budget 10m] [--out DIR]\n"
       "                   [-o BEST.toml] [--dry-run] [--finetune] [--remeasure] [--set section.key=value]... [--disable PASS]...\n\n"
       "Generates every strategy for N ranks around STRATEGY (what it states stays fixed): the mesh\n"
       "factorisations over the dimensions the loaded passes claim, the pass serving each dimension,\n"
       "passes that declare themselves worth trying (act_checkpoint), and the keys passes declare as\n"
       "searched (micro_batch, pipeline schedule, ...). Each candidate is checked as `strata plan`\n"
       "checks it; those that plan are ranked by predicted step time (FLOPs at this machine's matmul\n"
       "rate, collective bytes at its copy rate, the pipeline bubble of the schedule's simulation) and\n"
       "predicted peak memory per rank (model states by the ZeRO formulas, activations as the blocks\n"
       "save them, docs/tune.md).\n"
       "The top K that fit are then trained for 2 warm-up and 4 measured steps each (--trial-steps) by `strata run` in\n"
       "fresh processes (the first calibrates the memory predictions of the rest); those within 25% of\n"
       "the fastest are trained again, interleaved, and compared by their median. The fastest that\n"
       "ran within the memory budget is written as a strategy\n"
       "(a comment header says what was measured) and every candidate to DIR/tune.jsonl. Measured\n"
       "results and the machine's rates are cached (~/.cache/strata/tune_cache.jsonl) by strategy, ranks\n"
       "and machine, so tuning again on the same machine ranks the same way and measures only what is new.\n\n"
       "  -n, --ranks N        world size to search for\n"
       "  --memory-gb G        drop candidates predicted (or measured) to need more than G GiB per rank\n"
       "  --top K              candidates measured (default 6); with --dry-run, shown (default 20)\n"
       "  --rounds R           trials of each candidate within 25% of the fastest (default 3; 1: one each)\n"
       "  --trial-steps W+M    each trial's warm-up and measured steps (default 2+4); the peak memory is the\n"
       "                       largest any step reached, so 1+1 measures it in a third of the time\n"
       "  --budget T           stop starting trials after T (90s, 10m, 1h); the best so far wins\n"
       "  --out DIR            trials' run directories, logs and tune.jsonl (default runs/tune)\n"
       "  -o BEST.toml         where the chosen strategy goes (default DIR/best.toml)\n"
       "  --dry-run            print the ranked candidates without measuring anything\n"
       "  --finetune           start from a complete strategy: keep its layout and passes, search the\n"
       "                       declared values of their keys (its own values included) and optional passes\n"
       "  --remeasure          measure the machine's rates and every trial again (the cache is updated)\n"
       "  --set S.K=V          fix a key before searching, e.g. parallel.tensor=2\n"
       "  --disable PASS       keep a pass out of the search\n",
       run_tune},
      {"run", "Train with a strategy",
       "usage: strata run STRATEGY.toml [-n N [--simulate-nodes K]] [--out DIR] [--set section.key=value]... [--disable PASS]... [--resume | --overwrite]\n\n"
       "Trains in this process, or with -n N on N local ranks started through mpirun (a worker\n"
       "started by mpirun or srun directly reads its rank from their environment). DIR (default: [job] run_dir) receives strategy.toml (the resolved\n"
       "strategy, rerunnable as is), metrics.jsonl (one JSON object per optimizer step), logs/ and\n"
       "checkpoints/. A directory that already holds a run is refused unless --resume or --overwrite,\n"
       "and one run at a time may use a directory. With -n N the ranks are supervised: a rank that is\n"
       "killed, crashes or hangs restarts all of them from the newest checkpoint, up to [job]\n"
       "max_restarts times; events.jsonl in DIR records each failure and restart.\n\n"
       "  -n, --ranks N        number of local ranks\n"
       "  --simulate-nodes K   split the N ranks into K nodes of contiguous ranks on this machine, each\n"
       "                       with its own flash snapshot store (STRATA_FAULT=\"lose_node NODE STEP\"\n"
       "                       loses one: its ranks and its store); for tests and demos\n"
       "  --out DIR            run directory\n"
       "  --set S.K=V          override a key, e.g. job.steps=50 job.seed=7 job.checkpoint_every=10\n"
       "  --disable PASS       switch a pass off\n"
       "  --resume             continue from the newest valid checkpoint in DIR\n"
       "  --overwrite          replace the run DIR holds (its strategy.toml, metrics, checkpoints, logs)\n",
       run_train},
      {"ops", "List operators and the implementation each device and dtype gets",
       "usage: strata ops\n\n"
       "Shows every operator of the operator table with its implementations (core's reference and\n"
       "those plugins register), their priorities and what they support, and which one a CPU\n"
       "float32 and bfloat16 call dispatches to; then the CPU's model and features and, for each\n"
       "CPU fast path, what serves on this machine and why (STRATA_CPU_FALLBACK=KEY,... or all\n"
       "forces the fallbacks).\n",
       run_ops},
      {"ckpt", "Work with checkpoints: export to Hugging Face format, consolidate, describe",
       "usage: strata ckpt export RUN_DIR|CHECKPOINT_DIR OUT_DIR [--dtype fp32|bf16|fp16] [--max-shard-size SIZE]\n"
       "       strata ckpt consolidate RUN_DIR|CHECKPOINT_DIR OUT.safetensors\n"
       "       strata ckpt info RUN_DIR|CHECKPOINT_DIR\n\n"
       "A RUN_DIR stands for its newest valid checkpoint. Checkpoints saved by any number of ranks\n"
       "under any sharding (zero1, zero2, fsdp) are reassembled.\n\n"
       "  export       OUT_DIR/model.safetensors and OUT_DIR/config.json in the layout transformers\n"
       "               loads (GPT2LMHeadModel, LlamaForCausalLM); [model] init_from reads it back;\n"
       "               --dtype casts the weights (default fp32, the checkpoint's master weights) and\n"
       "               sets config.json's torch_dtype; weights above --max-shard-size (default 5GB;\n"
       "               500MB, 2GiB, bytes) are split as save_pretrained splits them, into\n"
       "               model-00001-of-0000N.safetensors and model.safetensors.index.json. It holds\n"
       "               the model in fp32 and one tensor's copy\n"
       "  consolidate  every tensor (model/, optimizer/, data/, rng/ and pass state) whole in one\n"
       "               safetensors file; per-rank state comes from rank 0\n"
       "  info         step, ranks, size, and each tensor's dtype, whole shape and how it is stored\n",
       run_ckpt},
      {"data", "Tokenize your own text into the token files the tokens dataset trains on",
       "usage: strata data prepare INPUT... -o DIR (--tokenizer tokenizer.json | --train-tokenizer VOCAB_SIZE)\n"
       "                           [--text-field NAME] [--val-fraction F] [--eos TOKEN]\n\n"
       "Reads plain text files (each file one document), JSON Lines (one document per line, its text\n"
       "in --text-field), .json files of one array (of such records or of strings) and Parquet (with\n"
       "pyarrow installed); tokenizes them with a Hugging Face tokenizer.json (GPT-2's, Llama 3's, ...)\n"
       "or a byte-level BPE trained on the corpus, using the tokenizers library (parallel over the\n"
       "cores; a large text file in pieces, the tokens written as they come); writes DIR/train.bin\n"
       "and DIR/val.bin (uint16, or uint32 above 65536 tokens; every document ended by the end-of-text\n"
       "id), DIR/tokenizer.json and DIR/meta.json. A strategy with [data] path = DIR trains on it:\n"
       "[job] dataset (\"tokens\"), [model] vocab_size and [data] document_end come from meta.json\n"
       "when left out, and the export carries the tokenizer. An INPUT may be a directory: its .txt,\n"
       ".md, .jsonl, .json, .ndjson and .parquet files at any depth, in path order (hidden ones apart;\n"
       "the others are counted and named).\n\n"
       "  -o, --output DIR         the directory to write\n"
       "  --tokenizer FILE         tokenize with this tokenizer.json\n"
       "  --train-tokenizer V      train a byte-level BPE of vocabulary V on the inputs\n"
       "  --text-field NAME        the JSON Lines / Parquet field holding the text (default text)\n"
       "  --val-fraction F         documents held out for validation, the last ones (default 0.05);\n"
       "                           the tail of the tokens when that is less than one document\n"
       "  --eos TOKEN              the end-of-text token (default: the first the tokenizer has of\n"
       "                           <|endoftext|>, <|end_of_text|>, </s>, <eos>, <|eot_id|>)\n",
       run_data},
      {"sample", "Continue a prompt with a run's newest checkpoint (byte-level or prepared-data runs) or a transformers directory",
       "usage: strata sample RUN_DIR|CHECKPOINT_DIR|HF_DIR --prompt TEXT [--tokens N] [--temperature T]\n"
       "                     [--top-k K] [--seed S]\n\n"
       "Loads the checkpoint's model whole (any layout and rank count that saved it), prints the prompt\n"
       "and its continuation. Runs on the text dataset (token id = byte) and on token files strata data\n"
       "prepare wrote (through their tokenizer.json); export other runs and sample them with transformers.\n"
       "HF_DIR: a directory save_pretrained or strata ckpt export wrote (config.json, the weights and\n"
       "tokenizer.json) of a model type a registered model loads (strata plugins), read as [model]\n"
       "init_from reads it, through its tokenizer.json.\n\n"
       "  --prompt TEXT        the text to continue\n"
       "  --tokens N           tokens to generate (default 100)\n"
       "  --temperature T      0 picks the likeliest token; above 0 samples (default 0.8)\n"
       "  --top-k K            sample among the K likeliest tokens only (default 0: all)\n"
       "  --seed S             the sampling generator's seed: one seed, one text (default 0)\n",
       run_sample},
      {"docs", "Print the strategy file reference generated from the declared keys",
       "usage: strata docs [-o FILE]\n\n"
       "Writes Markdown describing every section and key that core and the loaded plugins accept.\n\n"
       "  -o, --output FILE    write to FILE instead of standard output\n",
       run_docs},
      {"doctor", "Check the ranks' health: matmul throughput and results, all-reduce bandwidth",
       "usage: strata doctor [-n N]\n\n"
       "Every rank times an fp32 matmul on one thread and checks its result against the other\n"
       "ranks'; pairs of ranks (0-1, 2-3, ...) and then all ranks time an all-reduce. Rank 0 prints\n"
       "each rank's figures beside the median: a rank slower than the median by more than 1.5x is\n"
       "named a straggler; one that fails or computes a different result is faulty (exit status 1).\n\n"
       "  -n, --ranks N        number of local ranks (started through mpirun)\n",
       run_doctor},
      {"report", "Write an HTML report of runs: loss, learning rate, throughput, memory and goodput curves",
       "usage: strata report RUN_DIR|TUNE_DIR... [-o FILE]\n\n"
       "Reads each run's metrics.jsonl (and events.jsonl, strategy.toml where present) and writes one\n"
       "self-contained HTML file (inline SVG, no script, no network): a summary table; curves of loss\n"
       "and validation loss, learning rate, tokens/s, step time, peak memory, gradient norm and\n"
       "checkpoint blocking with the runs overlaid; each supervised run's goodput breakdown; and\n"
       "each run's strategy. A `strata tune --out` directory (tune.jsonl) among them shows predicted\n"
       "against measured step time and peak memory for every candidate measured, with their rank\n"
       "correlation and errors.\n\n"
       "  -o, --output FILE    the HTML file to write (default report.html)\n",
       run_report},
  };
  return list;
}

namespace {

void print_help() {
  std::cout << "usage: strata [--version] [--help] COMMAND [ARGS]\n\n"
               "Strata trains libtorch models with strategies assembled from plugins.\n\nCommands:\n";
  for (const auto& c : commands()) std::printf("  %-10s %s\n", c.name, c.summary);
  std::cout << "\nRun 'strata COMMAND --help' for a command's options. Exit status 2 means bad input.\n"
               "Set STRATA_PLUGIN_PATH (colon separated) to load plugins from more places.\n";
}

void print_version() {
  VersionInfo v = version_info();
  std::cout << "strata " << v.strata << " (plugin ABI " << v.abi << ")\n"
            << "libtorch " << v.torch << " (wheel " << v.torch_wheel << ", " << v.cxx_abi << ")\n"
            << "CUDA " << v.torch_cuda << " (the wheel's build); runtime: "
            << (v.cuda_available                      ? std::to_string(v.cuda_devices) + " device(s)"
                : v.cuda_runtime_absent.empty() ? std::string("no CUDA device")
                                                : "libtorch_cuda not loaded (" + v.cuda_runtime_absent + ")")
            << "\n";
}

int dispatch(int argc, char** argv) {
  Args args = parse_args(argc, argv);
  if (args.verbose) log::set_level(log::Level::Debug);
  if (args.command.empty()) {
    if (args.version) return print_version(), 0;
    print_help();
    return args.help ? 0 : 2;
  }
  for (const auto& c : commands()) {
    if (args.command != c.name) continue;
    if (args.help) return std::cout << c.usage, 0;
    return c.run(args);
  }
  if (args.command == "help") {
    print_help();
    return 0;
  }
  throw UserError("unknown command '" + args.command + "'; see strata --help");
}

}  // namespace
}  // namespace strata::cli

namespace {

// An internal error's one line for the terminal: the first line of what failed (libtorch's
// errors carry a C++ backtrace after it), and where the whole text went: the run's log
// (logs/rank_N.log) once a run has one, else a file of its own. A run's events.jsonl gets an
// "internal_error" event naming both. Returns {line, where}.
std::pair<std::string, std::string> internal_error(const std::exception& e) {
  const std::string full = e.what();
  std::string brief = full;
  if (const auto* torch_error = dynamic_cast<const c10::Error*>(&e)) brief = torch_error->what_without_backtrace();
  brief = brief.substr(0, brief.find('\n'));
  std::string where = strata::log::first_file();
  if (!where.empty()) {
    strata::log::record("internal error: " + full);
    const std::filesystem::path run_dir = std::filesystem::path(where).parent_path().parent_path();
    const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
    const nlohmann::json event{{"time", now}, {"event", "internal_error"}, {"rank", rank ? std::atoi(rank) : 0},
                               {"message", brief}, {"trace", where}};
    std::ofstream(run_dir / "events.jsonl", std::ios::app) << event.dump() << "\n";
  } else {
    where = (std::filesystem::temp_directory_path() / ("strata-internal-error-" + std::to_string(::getpid()) + ".txt")).string();
    std::ofstream(where) << full << "\n";
  }
  return {brief, where};
}

// Once this rank's error is written, how long it waits for the other ranks' before it exits:
// mpirun ends every rank as soon as one exits with an error, and a rank still unwinding the same
// error (a plan or pass refusal every rank meets) would be cut off before writing it; the
// launcher then said "error (rank 0,1,3)" for an error all four had (about 1 run in 8 of
// cli.pipeline_fsdp_unknown_wrap_entry under ctest -j 3). Ranks that meet one error together
// write within milliseconds; a rank failing alone waits this long while its peers, blocked in a
// collective, write nothing.
constexpr auto kWaitForPeersErrors = std::chrono::seconds(2);

// Whether every rank of the world has written its error file into `dir`.
bool every_rank_reported(const std::filesystem::path& dir, long world) {
  for (long r = 0; r < world; ++r)
    if (!std::filesystem::exists(dir / ("rank_" + std::to_string(r)))) return false;
  return true;
}

// A rank started by `strata run -n N` reports its error to the launcher, which prints each
// distinct message once (cmd_run.cpp); anywhere else the error goes to standard error, one line.
// The file appears whole (written under another name, then renamed).
void report(const char* kind, const std::string& message, const std::string& trace = {}) {
  const char* dir = std::getenv("STRATA_ERROR_DIR");
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (dir && rank) {
    const std::filesystem::path file = std::filesystem::path(dir) / ("rank_" + std::string(rank));
    const std::filesystem::path partial = file.string() + ".partial";
    if (std::FILE* f = std::fopen(partial.c_str(), "w")) {
      std::fprintf(f, "%s\n%s\n%s\n", kind, message.c_str(), trace.c_str());
      std::fclose(f);
      std::error_code failed;
      std::filesystem::rename(partial, file, failed);
      if (!failed) {
        const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
        const long world = size ? std::atol(size) : 1;
        const auto deadline = std::chrono::steady_clock::now() + kWaitForPeersErrors;
        while (world > 1 && !every_rank_reported(dir, world) && std::chrono::steady_clock::now() < deadline)
          ::usleep(10 * 1000);
        return;
      }
    }
  }
  if (std::string(kind) == "user") std::fprintf(stderr, "strata: error: %s\n", message.c_str());
  else std::fprintf(stderr, "strata: internal error: %s (full trace: %s)\n", message.c_str(), trace.c_str());
}

// Leaves without running static destructors. libtorch's deregister every operator kernel from its
// dispatcher at exit: about 0.15 s of CPU in every process (perf at the end of `strata run`:
// c10::impl::OperatorEntry::deregisterKernel_ and its kin), paid by the launcher after its ranks
// and by each rank. Nothing of Strata's waits for them: communicators (MPI_Finalize), files and
// helper processes belong to objects gone before main returns, and the log flushes every line;
// what standard output and error buffer is flushed here.
[[noreturn]] void leave(int status) {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  std::_Exit(status);
}

int run_command(int argc, char** argv) {
  try {
    return strata::cli::dispatch(argc, argv);
  } catch (const strata::UserError& e) {
    report("user", e.what());
    return 2;
  } catch (const std::filesystem::filesystem_error& e) {
    // A path the user named that cannot be created, read or replaced (an output directory under
    // a file, no permission, a full disk): the path and the reason, as a user error.
    std::string what = e.what();
    if (const std::string prefix = "filesystem error: "; what.rfind(prefix, 0) == 0) what = what.substr(prefix.size());
    report("user", what);
    return 2;
  } catch (const std::exception& e) {
    // Out of memory under [job] rank_memory_limit_mb is the configuration's, not a defect.
    if (strata::allocation_cap() > 0 && strata::is_allocation_failure(e.what())) {
      std::string what = e.what();
      if (const auto* torch_error = dynamic_cast<const c10::Error*>(&e)) what = torch_error->what_without_backtrace();
      report("user", "this rank ran out of the memory [job] rank_memory_limit_mb = " +
                         std::to_string(static_cast<int64_t>(strata::allocation_cap() / (1 << 20))) + " MiB allows it (" +
                         what.substr(0, what.find('\n')) + "); raise the limit, or shard more (fsdp, a larger data size, act_checkpoint)");
      return 2;
    }
    const auto [line, trace] = internal_error(e);
    report("internal", line, trace);
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) { leave(run_command(argc, argv)); }
