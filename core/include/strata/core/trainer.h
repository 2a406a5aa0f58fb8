// Single-process training of a resolved strategy: the step program, metrics and checkpoints.
#pragma once

#include <filesystem>
#include <vector>

#include "strata/core/component_registry.h"
#include "strata/core/strategy.h"

namespace strata {

struct RunOptions {
  std::filesystem::path out_dir;  // empty: [job] run_dir
  bool resume = false;            // continue from the newest valid checkpoint in out_dir
  bool overwrite = false;         // replace the run out_dir holds (else a non-empty out_dir is refused)
};

struct RunSummary {
  int64_t first_step = 0;  // the first step this run computed
  int64_t last_step = 0;
  double last_loss = 0;
};

// `order` is the pass order from order_passes. User errors are UserErrors.
STRATA_API RunSummary run_training(const ResolvedStrategy& plan, const std::vector<size_t>& order,
                                   const ComponentRegistry& registry, const RunOptions& options);

// The strategy with every key resolved (defaults written out), rerunnable as is.
STRATA_API std::string resolved_strategy_toml(const ResolvedStrategy& plan);

}  // namespace strata

namespace strata {

// Checkpoint tools. SOURCE is a run directory (its newest valid checkpoint is used) or one
// checkpoint directory inside it; each returns the checkpoint directory it used.

// Writes OUT/model.safetensors and OUT/config.json in Hugging Face layout.
STRATA_API std::filesystem::path export_hf(const std::filesystem::path& source, const std::filesystem::path& out,
                                           const ComponentRegistry& registry);

// Writes every tensor of the checkpoint, reassembled whole, to the safetensors file OUT. Per-rank
// state (the RNG) comes from rank 0.
STRATA_API std::filesystem::path consolidate_checkpoint(const std::filesystem::path& source, const std::filesystem::path& out);

// A human-readable account of what the checkpoint holds, one line per tensor.
STRATA_API std::string describe_checkpoint(const std::filesystem::path& source);

}  // namespace strata
