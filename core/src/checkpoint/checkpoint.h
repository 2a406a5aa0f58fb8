// Checkpoints: a directory per step holding per-rank safetensors files and manifest.json (step,
// state hash, world size, size and SHA-256 of every file). A file's metadata (`slices`) records
// the placement of each of its tensors that is a piece of a larger one, so any number of ranks
// under any layout can reassemble what they need. Written under a temporary name, fsynced and
// renamed, and only then recorded in `latest`; the newest `keep` are kept.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/comm.h"
#include "strata/optimizer.h"
#include "strata/core/flash_checkpoint.h"
#include "strata/core/safetensors_view.h"
#include "strata/core/safetensors.h"

namespace strata::engine {

struct CheckpointMeta {
  int64_t step = 0;
  std::string state_hash;
  int64_t world_size = 1;
};

// Collective over `world`: every rank writes its own state (`tensors`, named
// "<state key>/<tensor name>", with the placements of the pieces among them) as rank_NNNNN.safetensors and hashes
// its own file; the sizes and hashes are gathered (through `device`, which the communicator
// takes), and rank 0 writes the manifest and publishes the checkpoint. `heartbeat` runs after
// every piece of at most 64 MiB written: a long save is progress to the supervisor's hang watch.
STRATA_API void save_checkpoint(const std::filesystem::path& checkpoints_dir, const CheckpointMeta& meta,
                     const NamedTensors& tensors, const Placements& placements, int64_t keep, Communicator& world,
                     c10::Device device, const std::function<void()>& heartbeat = {});

// One rank's file of a checkpoint as its manifest records it.
struct CheckpointFile {
  std::string name;  // rank_NNNNN.safetensors
  uint64_t bytes = 0;
  std::string sha256;
};

// "rank_00003.safetensors": a rank's shard inside a step's directory (step_dir_name in
// strata/core/flash_checkpoint.h names the directory).
std::string shard_name(int rank);
// Where a checkpoint of `step` is assembled before publish_checkpoint makes it visible.
std::filesystem::path staging_dir(const std::filesystem::path& checkpoints_dir, int64_t step);
// Removes the staging directories of saves that never completed.
void remove_stale_staging(const std::filesystem::path& checkpoints_dir);
// The safetensors metadata of a rank file: format, step, and the placements of its pieces.
Metadata checkpoint_file_metadata(int64_t step, const Placements& placements);
// Writes the manifest of `files` (already written and fsynced in `staging`), renames the
// staging directory to the step's, records it in `latest` and deletes all but the newest `keep`:
// the one way a checkpoint becomes visible, for the ranks' own saves and the supervisor's
// persists of flash snapshots alike.
void publish_checkpoint(const std::filesystem::path& checkpoints_dir, const std::filesystem::path& staging,
                        const CheckpointMeta& meta, const std::vector<CheckpointFile>& files, int64_t keep);

// One rank's file, read whole: its tensors and the placements of those that are pieces.
struct RankFile {
  NamedTensors tensors;  // read-only views of the file's bytes
  Placements slices;
  std::shared_ptr<const MappedFile> mapping;  // the file on disk, or none (an image in memory)
};

// One tensor a rank wants from a checkpoint: `target` (on the CPU) receives the whole tensor
// `name`, or with `placement` set the piece of it that the placement names.
struct TensorRequest {
  std::string name;
  at::Tensor target;
  std::optional<Placement> placement;
};

// What a checkpoint holds under one name, over all its files.
struct StoredTensorInfo {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;   // of the whole tensor
  std::vector<int> whole_in;    // ranks whose file holds all of it
  std::vector<int> pieces_in;   // ranks whose file holds a piece of it
  int64_t stored_elements = 0;  // summed over files
};

// A verified checkpoint directory, read by tensor name whatever number of ranks and whatever
// sharding saved it.
class STRATA_API Checkpoint {
 public:
  // Verifies the manifest and every file's size and SHA-256; any problem is a UserError.
  static Checkpoint open(const std::filesystem::path& dir);
  // The same, or without the checksums (Deferred): the ranks of a job then verify them together,
  // each hashing its share of the files (checksum_problem_together).
  enum class Checksums { Verify, Deferred };
  static Checkpoint open(const std::filesystem::path& dir, Checksums checksums);
  // A checkpoint whose rank files are in memory (flash snapshots, flash_checkpoint.h): image r
  // is rank r's file, already verified; `keep_alive` owns the memory; `label` names it in messages.
  static Checkpoint from_images(const CheckpointMeta& meta, const std::string& label, std::vector<std::string_view> images,
                                std::shared_ptr<const void> keep_alive);

  const CheckpointMeta& meta() const { return meta_; }
  const std::filesystem::path& path() const { return dir_; }
  const std::vector<int>& ranks() const { return ranks_; }
  bool in_memory() const { return !images_.empty(); }  // flash images (from_images), not files

  // Fills every request, reading rank `prefer`'s file first (per-rank state such as the RNG
  // comes from it) and other files only for what it lacks. A tensor the checkpoint lacks, holds
  // with another whole shape or dtype, or covers only in part is a UserError naming it.
  // `heartbeat` runs after each stored tensor is read (a long restore is progress).
  void fill(std::vector<TensorRequest>& requests, int prefer, const std::function<void()>& heartbeat = {}) const;

  // Every name in the checkpoint, in file order of the lowest rank holding it.
  std::vector<StoredTensorInfo> describe() const;

 private:
  RankFile read_rank(int rank) const;
  CheckpointMeta meta_;
  std::filesystem::path dir_;
  std::vector<int> ranks_;
  std::vector<std::string_view> images_;  // empty: the files in dir_
  std::shared_ptr<const void> keep_alive_;
};

// The step directories of `checkpoints_dir`, newest first, valid or not.
std::vector<std::filesystem::path> checkpoint_dirs_newest_first(const std::filesystem::path& checkpoints_dir);

// The checkpoint in `dir` if it passes every check; otherwise appends "checkpoint DIR: reason"
// to `reasons` and returns nothing.
std::optional<Checkpoint> open_checkpoint_or_explain(const std::filesystem::path& dir, std::vector<std::string>& reasons,
                                                     Checkpoint::Checksums checksums = Checkpoint::Checksums::Verify);

// Called by every rank of `world` together for a checkpoint opened with Checksums::Deferred:
// rank r hashes files r, r + N, ... (in the manifest's order) and one all-reduce on `device`
// shares what they found, so each file is read once per job rather than once per rank (a
// 1.4 GiB GPT-2 checkpoint at 4 ranks: 1.4 GiB hashed in all, not 5.6). Returns the reason the
// checkpoint fails its checksums, the same on every rank, or nullopt.
std::optional<std::string> checksum_problem_together(const Checkpoint& checkpoint, Communicator& world, c10::Device device,
                                                     const std::function<void()>& heartbeat = {});

// Writes `text` to `path` through a temporary file, fsync and rename, so readers see the old
// file or the new one, never a part; a failed write is a FileWriteError naming the file (the
// temporary file removed).
void write_text_durably(const std::filesystem::path& path, const std::string& text);

// Makes the bytes of a written file durable (before it is renamed into place): fsync of the file.
void fsync_file(const std::filesystem::path& file);

// Makes the entries of `dir` (files renamed into it) durable: fsync of the directory ("" is the
// working directory).
void fsync_directory(const std::filesystem::path& dir);

// The newest checkpoint that passes every check. Each one that does not is reported through
// `warn` with the reason, and skipped.
std::optional<Checkpoint> open_newest_valid_checkpoint(const std::filesystem::path& checkpoints_dir,
                                                       const std::function<void(const std::string&)>& warn);

// "[2, 3]": how messages and `strata ckpt info` write a shape.
std::string shape_text(c10::IntArrayRef shape);

// Verifies a checkpoint directory; returns the reason it is unusable, or nullopt.
std::optional<std::string> checkpoint_problem(const std::filesystem::path& dir,
                                              Checkpoint::Checksums checksums = Checkpoint::Checksums::Verify);

}  // namespace strata::engine
