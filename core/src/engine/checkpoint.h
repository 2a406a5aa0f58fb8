// Checkpoints: a directory per step holding per-rank safetensors shards and manifest.json (step,
// config hash, world layout, size and SHA-256 of every file). Written under a temporary name,
// fsynced and renamed, and only then recorded in `latest`; the newest `keep` are kept.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "strata/comm.h"
#include "strata/optimizer.h"

namespace strata::engine {

struct CheckpointMeta {
  int64_t step = 0;
  std::string config_hash;
  int64_t world_size = 1;
};

// Collective over `world`: every rank writes its own state (`tensors`, named
// "<state key>/<tensor name>") as rank_NNNNN.safetensors; rank 0 writes the manifest and
// publishes the checkpoint once all shards are on disk.
void save_checkpoint(const std::filesystem::path& checkpoints_dir, const CheckpointMeta& meta,
                     const NamedTensors& tensors, int64_t keep, Communicator& world);

struct LoadedCheckpoint {
  CheckpointMeta meta;
  std::filesystem::path path;
  NamedTensors tensors;
};

// The newest checkpoint that passes every check, with the shard of `rank`. Each one that does
// not is reported through `warn` with the reason, and skipped.
std::optional<LoadedCheckpoint> load_newest_valid_checkpoint(const std::filesystem::path& checkpoints_dir, int rank,
                                                             const std::function<void(const std::string&)>& warn);

// Loads the shard of `rank` from one checkpoint directory after verifying every file; any
// problem is a UserError.
LoadedCheckpoint load_checkpoint(const std::filesystem::path& dir, int rank);

// Verifies a checkpoint directory; returns the reason it is unusable, or nullopt.
std::optional<std::string> checkpoint_problem(const std::filesystem::path& dir);

}  // namespace strata::engine
