// Training on this rank (the Trainer): the step program, metrics and checkpoints of a resolved strategy.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/core/component_registry.h"
#include "strata/core/strategy.h"
#include "strata/job.h"

namespace strata {

struct RunOptions {
  std::filesystem::path out_dir;  // empty: [job] run_dir
  bool resume = false;            // continue from the newest valid checkpoint in out_dir
  bool overwrite = false;         // replace the run out_dir holds (else a non-empty out_dir is refused)
  // The loss of one micro-batch, (logits [B, T, V] as the model returns them, targets [B, T]) ->
  // the mean loss, in place of core's cross entropy (the library API's). A pass that replaces the
  // loss itself (a vocab-parallel or fused loss) cannot serve it: the Trainer refuses the pair.
  std::function<at::Tensor(const at::Tensor& logits, const at::Tensor& targets)> loss;
};

struct RunSummary {
  int64_t first_step = 0;  // the first step this run computed
  int64_t last_step = 0;
  double last_loss = 0;
};

// What one optimizer step did: the figures metrics.jsonl records for it.
struct StepRecord {
  int64_t step = 0;
  double loss = 0;
  double grad_norm = 0;
  double lr = 0;
  int64_t tokens = 0;  // tokens this step consumed
  double step_ms = 0;
  std::optional<double> val_loss;
  std::vector<std::pair<std::string, double>> extra;  // reported by passes and the model
};

// The training of a resolved strategy on this rank: what `strata run` runs, and what the library
// API hands a program that trains its own way. Construction does everything before the first
// step: the ranks meet (a collective over the world, as are step, save and load), the run
// directory is claimed, the model, data and core's step program are built, the passes applied
// in `order` (from order_passes), the optimizer made, and with options.resume the newest
// checkpoint restored. `registry` must outlive the trainer. User errors are UserErrors.
class STRATA_API Trainer {
 public:
  Trainer(const ResolvedStrategy& plan, std::vector<size_t> order, const ComponentRegistry& registry, RunOptions options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Runs the next step of the step program, then evaluates and checkpoints when [job]
  // eval_every, checkpoint_every or flash_every say so (and at the last step), and records it in
  // metrics.jsonl. Past [job] steps it is a UserError: the learning-rate schedule ends there.
  const StepRecord& step();
  // Steps through [job] steps, then waits for the last flash snapshot. Figures are read from
  // the device only on steps that log, evaluate or checkpoint (step() reads every step).
  RunSummary run();
  // The same, stopping before a step when `stop_requested` says so (a single process's Ctrl-C or
  // SIGTERM; over several ranks, when it said so on any rank at the last read of the figures, a
  // logging step, so that all stop after the same step) or the supervisor asked every rank to
  // stop there (progress.h: request_stop); every step done is recorded. Then completed_steps() <
  // total_steps().
  RunSummary run(const std::function<bool()>& stop_requested);
  // A checkpoint of the last completed step on disk (collective); returns the seconds it took.
  double save();
  // Restores the newest checkpoint of the run directory that every rank can read (a flash
  // snapshot in shared memory first, under a supervisor), falling back to older ones; returns
  // false when there is none, a UserError when none can be restored.
  bool load();

  int64_t completed_steps() const;  // the last step done (or restored)
  int64_t total_steps() const;      // [job] steps
  const StepRecord& metrics() const;  // the last step's record
  Job& job();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// `strata run` on this rank: Trainer(plan, order, registry, options).run().
STRATA_API RunSummary run_training(const ResolvedStrategy& plan, const std::vector<size_t>& order,
                                   const ComponentRegistry& registry, const RunOptions& options);

// The strategy with every key resolved (defaults written out), rerunnable as is.
STRATA_API std::string resolved_strategy_toml(const ResolvedStrategy& plan);

}  // namespace strata

namespace strata {

// Checkpoint tools. SOURCE is a run directory (its newest valid checkpoint is used) or one
// checkpoint directory inside it; each returns the checkpoint directory it used.

// The checkpoint's model whole in this process, whatever layout and ranks saved it, with the run's
// strategy resolved for the world that saved it (export and sample read models this way).
struct CheckpointModel {
  std::shared_ptr<nn::Model> model;
  ResolvedStrategy plan;
  Config model_config;  // [model], init_from cleared: the weights come from the checkpoint
  std::filesystem::path checkpoint;
};
STRATA_API CheckpointModel load_checkpoint_model(const std::filesystem::path& source, const ComponentRegistry& registry);
// A directory transformers' save_pretrained (or `strata ckpt export`) wrote: config.json and its
// weights, no strategy.toml. load_hf_model builds the registered model that loads its model_type,
// every [model] key from config.json, seq_len its context, the weights from the directory (as
// [model] init_from loads them), for `strata sample` on a hub model or an export.
STRATA_API bool is_hf_directory(const std::filesystem::path& dir);
STRATA_API CheckpointModel load_hf_model(const std::filesystem::path& dir, const ComponentRegistry& registry);

// How `strata ckpt export` writes the weights: their floating-point dtype (float32, bfloat16 or
// float16; cast one tensor at a time as it is written, config.json's torch_dtype saying which) and
// the largest weight file. A model within it is one model.safetensors; a larger one is split as
// transformers' save_pretrained splits it, model-00001-of-0000N.safetensors with
// model.safetensors.index.json (5 GB, huggingface_hub's default: files the hub and its tools take).
struct ExportOptions {
  at::ScalarType dtype = at::kFloat;
  uint64_t max_shard_bytes = 5'000'000'000;
};

// Writes OUT's weights, OUT/config.json in Hugging Face layout (and the tokenizer where the run's
// data names one: bytes for the text dataset). It holds a few parameters at a time (up to 8 MiB
// beyond the one being written), each filled from the checkpoint as it comes up for writing
// (core/src/checkpoint/parameter_stream.h).
STRATA_API std::filesystem::path export_hf(const std::filesystem::path& source, const std::filesystem::path& out,
                                           const ComponentRegistry& registry, const ExportOptions& options);
STRATA_API std::filesystem::path export_hf(const std::filesystem::path& source, const std::filesystem::path& out,
                                           const ComponentRegistry& registry);
// The same with the weights written in `dtype` (ExportOptions{dtype}).
STRATA_API std::filesystem::path export_hf(const std::filesystem::path& source, const std::filesystem::path& out,
                                           const ComponentRegistry& registry, at::ScalarType dtype);

// Writes every tensor of the checkpoint, reassembled whole, to the safetensors file OUT. Per-rank
// state (the RNG) comes from rank 0.
STRATA_API std::filesystem::path consolidate_checkpoint(const std::filesystem::path& source, const std::filesystem::path& out);

// Continues `prompt` by `tokens` tokens with the checkpoint's model: greedy at temperature 0, else
// sampled from the softmax of logits / temperature over the top_k likeliest (0: all), with a
// generator seeded by `seed`. Returns the prompt and its continuation as text. Byte-level runs
// (the text dataset) only: token files name no tokenizer Strata can run (UserError); `strata
// sample` tokenizes runs on prepared token files itself and calls continue_tokens.
struct SampleOptions {
  std::string prompt;
  int64_t tokens = 100;
  double temperature = 0.8;
  int64_t top_k = 0;
  uint64_t seed = 0;
};
STRATA_API std::string sample_text(const std::filesystem::path& source, const SampleOptions& options,
                                   const ComponentRegistry& registry);
STRATA_API std::string sample_text(CheckpointModel& loaded, const SampleOptions& options);
// `bytes` as valid UTF-8: each maximal invalid subpart becomes one U+FFFD, as Python's
// bytes.decode("utf-8", "replace") and transformers' byte-level decoder do. sample_text's text.
STRATA_API std::string utf8_or_replacement(std::string_view bytes);
// The token loop sample_text runs, for a caller that tokenizes itself (`strata sample` on a run
// over token files, through the run's tokenizer): `ids` continued by options.tokens tokens, each
// from the last [model] max_positions (or seq_len) tokens.
STRATA_API std::vector<int64_t> continue_tokens(CheckpointModel& loaded, std::vector<int64_t> ids, const SampleOptions& options);

// A human-readable account of what the checkpoint holds, one line per tensor.
STRATA_API std::string describe_checkpoint(const std::filesystem::path& source);

}  // namespace strata
