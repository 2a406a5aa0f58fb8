// Checkpoints: a directory per step holding per-rank safetensors shards and manifest.json (step,
// config hash, world layout, size and SHA-256 of every file). Written under a temporary name,
// fsynced and renamed, and only then recorded in `latest`; the newest `keep` are kept.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "strata/optimizer.h"

namespace strata::engine {

struct CheckpointMeta {
  int64_t step = 0;
  std::string config_hash;
  int64_t world_size = 1;
};

// `tensors` are the states of one rank, named "<state key>/<tensor name>".
void save_checkpoint(const std::filesystem::path& checkpoints_dir, const CheckpointMeta& meta,
                     const NamedTensors& tensors, int64_t keep);

struct LoadedCheckpoint {
  CheckpointMeta meta;
  std::filesystem::path path;
  NamedTensors tensors;
};

// The newest checkpoint that passes every check. Each one that does not is reported through
// `warn` with the reason, and skipped.
std::optional<LoadedCheckpoint> load_newest_valid_checkpoint(const std::filesystem::path& checkpoints_dir,
                                                             const std::function<void(const std::string&)>& warn);

// Loads one checkpoint directory after verifying it; any problem is a UserError.
LoadedCheckpoint load_checkpoint(const std::filesystem::path& dir);

// Verifies a checkpoint directory; returns the reason it is unusable, or nullopt.
std::optional<std::string> checkpoint_problem(const std::filesystem::path& dir);

}  // namespace strata::engine
