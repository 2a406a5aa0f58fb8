// The library API: a program keeps its own model, data and loss, and hands Strata the "how" (a
// strategy: a file, a string, or the automatic search, measured in this program). What comes back is the Trainer that
// `strata run` runs: the same step program, passes, checkpoints, metrics and resume.
//
//   auto result = strata::accelerate(std::make_unique<MyModel>(), {"adamw", {"lr=1e-3"}},
//                                    nullptr, {}, strata::Strategy::from_file("fsdp.toml"));
//   if (!result.ok) { std::cerr << result.status << "\n"; return 2; }
//   result.trainer->run();
//
// The model is a ModelFactory building an nn::Model of blocks (strata/nn.h), so every pass that
// applies to the bundled models applies to it, model-parallel ones included where its layers
// declare how they split (create_shard). Under mpirun or `strata run -n N` each rank calls
// accelerate() with the same arguments. Compared with `strata run`, nothing is re-read from
// disk and no child processes are started (restarts are the launcher's: see docs/library.md).
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/modules/container/sequential.h>

#include "strata/core/component_registry.h"
#include "strata/core/trainer.h"
#include "strata/data.h"
#include "strata/model.h"
#include "strata/optimizer.h"

namespace strata {

// How to train: a strategy's text with `--set` and `--disable` overrides, as `strata run` takes
// it. The program's own model, dataset and optimizer (accelerate's arguments) fill in [job] model,
// [job] dataset and [optimizer] name; a strategy naming another is refused.
class STRATA_API Strategy {
 public:
  // Read now; an unreadable file is a UserError.
  static Strategy from_file(const std::filesystem::path& file);
  static Strategy from_toml(std::string text, std::string label = "<strategy>");
  // The fastest layout and passes for `ranks` ranks within `memory_gb` per rank (0: no limit),
  // around `base` (what the program fixes: [job] steps and batch, a pass it wants), as `strata
  // tune` finds them: candidates from the passes' declarations, ranked by the cost model
  // (strata/core/tune.h, at its default hardware rates), the best `trials` trained for 2 + 3 steps
  // each in this process (fresh trainers, run directories beside the run's: OUT.trials/), the
  // fastest measured taken. trials <= 1: the cost model's first, predicted, not measured.
  static Strategy automatic(int64_t ranks, std::string base = "", double memory_gb = 0, int trials = 3);

  Strategy& set(std::string key_value);  // "job.steps=10", "pass.fsdp.bucket_mb=4"
  Strategy& disable(std::string pass);

  const std::string& text() const { return text_; }
  const std::string& label() const { return label_; }
  const StringList& sets() const { return sets_; }
  const StringList& disables() const { return disables_; }
  int64_t automatic_ranks() const { return automatic_ranks_; }  // 0: not automatic
  double memory_gb() const { return memory_gb_; }
  int trials() const { return trials_; }

 private:
  std::string text_, label_;
  StringList sets_, disables_;
  int64_t automatic_ranks_ = 0;
  double memory_gb_ = 0;
  int trials_ = 0;
};

// The optimizer: a registered one by name ("adamw", "agd", ...; empty: the strategy's [optimizer]
// name) or the program's own factory, with [optimizer] keys as "key=value".
struct OptimizerSpec {
  std::string name;
  StringList settings;
  std::unique_ptr<OptimizerFactory> custom;
};

// A plain libtorch module (not written as blocks) and its forward: tokens [B, T] int64 -> logits
// [B, T, vocab_size].
struct PlainModule {
  std::shared_ptr<torch::nn::Module> module;
  std::function<at::Tensor(const at::Tensor& tokens)> forward;
};

// The model factory of a plain module: `build` runs on every rank after Strata seeded the RNG,
// so every rank starts from the same values (and a resumed run from the checkpoint's). Only the
// passes that need no knowledge of the model's layers apply: ddp, zero1/zero2, fsdp (the module as
// one unit), amp, half, act_checkpoint (the whole module), AGD/WSAM; weight decay goes to the
// weights of its torch::nn::Linear layers. A tensor, pipeline, context or expert layout is
// refused by accelerate(): those need the model written as blocks of strata::nn layers.
STRATA_API std::unique_ptr<ModelFactory> plain_module_factory(std::string name, std::function<PlainModule()> build, int64_t vocab_size,
                                                               int64_t seq_len);
// The same for a module type with `at::Tensor forward(const at::Tensor&)`.
template <class M>
std::unique_ptr<ModelFactory> plain_module(std::string name, std::function<std::shared_ptr<M>()> build, int64_t vocab_size,
                                           int64_t seq_len) {
  return plain_module_factory(
      std::move(name),
      [build = std::move(build)] {
        std::shared_ptr<M> module = build();
        return PlainModule{module, [module](const at::Tensor& tokens) { return module->forward(tokens); }};
      },
      vocab_size, seq_len);
}

// The model factory of a plain torch::nn::Sequential, each child a block of its own, named as in
// the Sequential (its index, or the name given in {"name", module} pairs) and typed "embedding"
// (the first), "head" (the last) or "block" (the others), as the bundled models' blocks are: so
// the passes that work block by block reach its children. act_checkpoint recomputes the children
// it selects (`blocks = ["hidden"]`; by default those typed "block"), fsdp gathers each child as a
// unit, ddp and zero bucket them in order. The first child takes tokens [B, T] int64, the last
// returns logits [B, T, vocab_size]; each child's forward takes and returns one tensor. Model
// parallel layouts are refused as for plain_module_factory.
STRATA_API std::unique_ptr<ModelFactory> plain_sequential(std::string name, std::function<torch::nn::Sequential()> build,
                                                          int64_t vocab_size, int64_t seq_len);

// A dataset held by the program: token streams (int64 or any integer dtype, 1-D) for the train
// and validation splits, tokens below `vocab_size`. Core's sampler windows, shuffles and batches
// them as it does any dataset, so resume and elastic restarts stay exact. The factory takes no
// [data] keys.
STRATA_API std::unique_ptr<DatasetFactory> tensor_dataset(std::string name, int64_t vocab_size, at::Tensor train, at::Tensor validation);

// A dataset the program produces sample by sample, as PyTorch's map-style datasets do:
// sample(split, i) returns sample i of the split (0 <= i < train_samples or validation_samples):
// seq_len + 1 tokens (inputs and the shifted targets), 1-D integer, below `vocab_size`. The
// sampler addresses samples by index, so shuffling, resume and elastic restarts stay exact as
// long as the callback is a pure function of (split, index); it is called from the sampler's
// prefetch thread, so it must be safe to call from there. A job whose [model] seq_len differs
// from `seq_len` is refused at its first batch. The factory takes no [data] keys.
using SampleFn = std::function<at::Tensor(Split split, int64_t index)>;
STRATA_API std::unique_ptr<DatasetFactory> sample_dataset(std::string name, int64_t vocab_size, int64_t seq_len, int64_t train_samples,
                                                          int64_t validation_samples, SampleFn sample);

// A dataset the program produces as a stream, as PyTorch's iterable-style datasets do:
// open(split) starts the split's stream from its beginning and returns a function giving its
// next sample (seq_len + 1 tokens, 1-D integer, below `vocab_size`) at each call, or an undefined
// tensor when it ends. Strata reads a stream in order: it skips forward to the sample it needs
// and starts the stream again for an earlier one (a resume, each evaluation, each new epoch of
// `train_samples`), so resume and elastic restarts stay exact as long as the stream gives the
// same samples whenever it starts. It is refused with [job] shuffle = true. Every data rank reads
// the whole global batch, so every rank runs the stream. Called from the sampler's prefetch
// thread; one split's stream is never read from two threads at once.
using StreamFn = std::function<std::function<at::Tensor()>(Split split)>;
STRATA_API std::unique_ptr<DatasetFactory> stream_dataset(std::string name, int64_t vocab_size, int64_t seq_len, int64_t train_samples,
                                                          int64_t validation_samples, StreamFn open);

// (logits [B, T, V], targets [B, T]) -> the mean loss of the micro-batch.
using LossFn = std::function<at::Tensor(const at::Tensor& logits, const at::Tensor& targets)>;

struct AccelerateOptions {
  RunOptions run;                                   // run directory, resume, overwrite
  std::vector<std::filesystem::path> plugin_dirs;   // plugins beyond the bundled ones
};

struct Accelerated {
  bool ok = false;
  std::string status;    // what failed (every problem, one per line) when !ok; notes otherwise
  std::string strategy;  // the strategy as planned, every key resolved (strata run's strategy.toml)
  std::string step_program;  // what one step runs, as `strata plan` prints it
  std::unique_ptr<ComponentRegistry> registry;  // the components the trainer was built from
  std::unique_ptr<Trainer> trainer;             // set when ok

  Accelerated() = default;
  Accelerated(Accelerated&&) = default;
  // The trainer goes before the registry whose plugins' code it runs.
  Accelerated& operator=(Accelerated&& other) noexcept {
    trainer.reset();
    ok = other.ok, status = std::move(other.status), strategy = std::move(other.strategy);
    step_program = std::move(other.step_program);
    registry = std::move(other.registry);
    trainer = std::move(other.trainer);
    return *this;
  }
};

// Plans `strategy` with the program's components (null: the strategy names a registered one)
// and builds the trainer on this rank, as `strata plan` then `strata run` would. A loss function
// (empty: core's cross entropy) replaces core's. Problems come back in `status`, never thrown.
STRATA_API Accelerated accelerate(std::unique_ptr<ModelFactory> model, OptimizerSpec optimizer,
                                  std::unique_ptr<DatasetFactory> dataset, LossFn loss, Strategy strategy,
                                  AccelerateOptions options = {});

}  // namespace strata
