#include "checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>
#include <nlohmann/json.hpp>

#include "checkpoint/sha256.h"
#include "strata/core/log.h"
#include "strata/core/safetensors.h"
#include "strata/core/safetensors_view.h"
#include "strata/errors.h"

namespace strata {

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08ld", static_cast<long>(step));
  return buf;
}

}  // namespace strata

namespace strata::engine {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "strata-checkpoint-1";

std::vector<fs::path> step_dirs_newest_first(const fs::path& checkpoints_dir) {
  std::vector<fs::path> dirs;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(checkpoints_dir, ec))
    if (entry.is_directory() && entry.path().filename().string().rfind("step_", 0) == 0) dirs.push_back(entry.path());
  std::sort(dirs.rbegin(), dirs.rend());
  return dirs;
}

nlohmann::json read_manifest(const fs::path& dir) {
  // Only a regular file is opened: a FIFO or device would block the reader or never end.
  std::error_code ec;
  if (!fs::is_regular_file(fs::symlink_status(dir / "manifest.json", ec))) throw UserError("no manifest.json (as a regular file)");
  std::ifstream in(dir / "manifest.json");
  if (!in) throw UserError("no manifest.json");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(std::string("manifest.json is not valid JSON: ") + e.what());
  }
}

}  // namespace

namespace {
void fsync_opened(const fs::path& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  if (fd >= 0) ::fsync(fd), ::close(fd);
}
}  // namespace

void fsync_file(const fs::path& file) { fsync_opened(file, O_RDONLY); }

void fsync_directory(const fs::path& dir) { fsync_opened(dir.empty() ? fs::path(".") : dir, O_RDONLY | O_DIRECTORY); }

void write_text_durably(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  std::error_code ignored;
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    if (!out.flush()) {
      const std::string reason = std::strerror(errno);
      fs::remove(tmp, ignored);
      throw FileWriteError(path, reason);
    }
  }
  fsync_file(tmp);
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ignored);
    throw FileWriteError(path, ec.message());
  }
  fsync_directory(path.parent_path());
}

std::vector<fs::path> checkpoint_dirs_newest_first(const fs::path& checkpoints_dir) { return step_dirs_newest_first(checkpoints_dir); }

std::string shard_name(int rank) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "rank_%05d.safetensors", rank);
  return buf;
}

void save_checkpoint(const fs::path& checkpoints_dir, const CheckpointMeta& meta, const NamedTensors& tensors,
                     const Placements& placements, int64_t keep, Communicator& world, c10::Device device,
                     const std::function<void()>& heartbeat) {
  const fs::path staging = staging_dir(checkpoints_dir, meta.step);
  const bool leader = world.rank() == 0;
  if (leader) {
    fs::create_directories(checkpoints_dir);
    remove_stale_staging(checkpoints_dir);  // saves that never completed (a kill mid-save)
    fs::create_directories(staging);
  }
  world.barrier()->wait();
  const fs::path own = staging / shard_name(world.rank());
  // Each rank hashes what it writes as it writes it, in parallel with the others (reading the
  // file back took as long again); rank 0 collects 64 hex digits and 8 size bytes per rank.
  Sha256 hash;
  try {
    write_safetensors(own, tensors, checkpoint_file_metadata(meta.step, placements), [&](const void* data, size_t size) {
      hash.update(data, size);
      if (heartbeat) heartbeat();
    });
  } catch (const FileWriteError& e) {
    // One line for every rank the file system refused (the supervisor prints each distinct
    // message once): the checkpoint and the reason, not this rank's file. The checkpoints
    // published before stay as they are.
    const std::vector<fs::path> saved = step_dirs_newest_first(checkpoints_dir);
    throw UserError("cannot save the checkpoint of step " + std::to_string(meta.step) + " in " + checkpoints_dir.string() + ": " +
                    e.reason + (saved.empty() ? "; no checkpoint was saved before" : "; the newest saved before, " + saved.front().filename().string() + ", is intact"));
  }
  constexpr int64_t kRecord = 72;
  const std::string digest = hash.hex_digest();
  const uint64_t bytes = fs::file_size(own);
  at::Tensor mine = at::empty({kRecord}, at::kByte);
  std::memcpy(mine.data_ptr(), digest.data(), 64);
  std::memcpy(static_cast<uint8_t*>(mine.data_ptr()) + 64, &bytes, 8);
  at::Tensor all = at::empty({kRecord * world.size()}, at::TensorOptions().dtype(at::kByte).device(device));
  world.all_gather(all, mine.to(device))->wait();
  all = all.cpu();
  if (!leader) {
    world.barrier()->wait();  // until rank 0 has published it
    return;
  }
  std::vector<CheckpointFile> files;
  for (int r = 0; r < world.size(); ++r) {
    const auto* record = static_cast<const uint8_t*>(all.data_ptr()) + kRecord * r;
    uint64_t size = 0;
    std::memcpy(&size, record + 64, 8);
    files.push_back({shard_name(r), size, std::string(reinterpret_cast<const char*>(record), 64)});
  }
  publish_checkpoint(checkpoints_dir, staging, meta, files, keep);
  world.barrier()->wait();
}

void publish_checkpoint(const fs::path& checkpoints_dir, const fs::path& staging, const CheckpointMeta& meta,
                        const std::vector<CheckpointFile>& files, int64_t keep) {
  nlohmann::json listed = nlohmann::json::object();
  for (const auto& file : files) listed[file.name] = {{"bytes", file.bytes}, {"sha256", file.sha256}};
  nlohmann::json manifest = {{"format", kFormat},
                             {"step", meta.step},
                             {"state_hash", meta.state_hash},
                             {"world_size", meta.world_size},
                             {"files", listed}};
  write_text_durably(staging / "manifest.json", manifest.dump(2) + "\n");
  fsync_directory(staging);

  const std::string name = step_dir_name(meta.step);
  const fs::path final_dir = checkpoints_dir / name;
  fs::remove_all(final_dir);
  fs::rename(staging, final_dir);
  fsync_directory(checkpoints_dir);
  write_text_durably(checkpoints_dir / "latest", name + "\n");

  std::vector<fs::path> dirs = step_dirs_newest_first(checkpoints_dir);
  for (size_t i = static_cast<size_t>(keep); i < dirs.size(); ++i) fs::remove_all(dirs[i]);
}

Metadata checkpoint_file_metadata(int64_t step, const Placements& placements) {
  // Metadata key and fields as Strata has always written them ("slices": shape, offset, and the
  // optional block), plus sections and the mesh dimensions the piece is sharded over.
  nlohmann::json slice_json = nlohmann::json::object();
  for (const auto& [name, p] : placements) {
    nlohmann::json& entry = slice_json[name] = {{"shape", p.shape}, {"offset", p.offset}};
    if (p.has_block()) entry["block_start"] = p.block_start, entry["block_size"] = p.block_size;
    if (p.sections > 1) entry["sections"] = p.sections;
    if (!p.sharded_over.empty()) {
      std::vector<std::string> dims;
      for (Dim d : p.sharded_over) dims.push_back(dim_name(d));
      entry["sharded_over"] = dims;
    }
    if (p.data_shard_size > 0) entry["data_shard_size"] = p.data_shard_size;
  }
  return {{"format", kFormat}, {"step", std::to_string(step)}, {"slices", slice_json.dump()}};
}

fs::path staging_dir(const fs::path& checkpoints_dir, int64_t step) { return checkpoints_dir / (".tmp-" + step_dir_name(step)); }

void remove_stale_staging(const fs::path& checkpoints_dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(checkpoints_dir, ec))
    if (entry.path().filename().string().rfind(".tmp-step_", 0) == 0) fs::remove_all(entry.path(), ec);
}

std::optional<std::string> checkpoint_problem(const fs::path& dir, Checkpoint::Checksums checksums) {
  try {
    nlohmann::json manifest = read_manifest(dir);
    if (manifest.value("format", "") != kFormat) return "manifest.json is not a " + std::string(kFormat) + " manifest";
    if (!manifest.contains("files") || !manifest["files"].is_object() || manifest["files"].empty())
      return "manifest.json lists no files";
    for (const auto& [file, info] : manifest["files"].items()) {
      const fs::path path = dir / file;
      std::error_code ec;
      const auto size = fs::file_size(path, ec);
      if (ec) return file + " is missing";
      if (size != info.value("bytes", uint64_t{0}))
        return file + " has " + std::to_string(size) + " bytes, the manifest says " + std::to_string(info.value("bytes", uint64_t{0}));
      if (checksums == Checkpoint::Checksums::Verify && sha256_file(path) != info.value("sha256", ""))
        return file + " fails its SHA-256 checksum";
    }
  } catch (const std::exception& e) {
    return e.what();
  }
  return std::nullopt;
}

namespace {

// The rank file's tensors are views of `image` (kept alive by `owner`): fill() copies only the
// elements a request needs.
RankFile read_rank_file(std::string_view image, std::shared_ptr<const void> owner, const std::string& label) {
  Metadata metadata;
  RankFile file{view_safetensors(image, std::move(owner), label, &metadata), {}};
  auto it = metadata.find("slices");
  if (it == metadata.end()) return file;
  try {
    const nlohmann::json slices = nlohmann::json::parse(it->second);
    for (const auto& [name, info] : slices.items()) {
      Placement placement;
      placement.shape = info.at("shape").get<std::vector<int64_t>>();
      placement.offset = info.at("offset").get<int64_t>();
      if (info.contains("block_size")) {
        placement.block_start = info.at("block_start").get<std::vector<int64_t>>();
        placement.block_size = info.at("block_size").get<std::vector<int64_t>>();
      }
      placement.sections = info.value("sections", int64_t{1});
      file.slices[name] = std::move(placement);
    }
  } catch (const nlohmann::json::exception& e) {
    throw UserError(label + ": its slices metadata is malformed: " + e.what());
  }
  for (const auto& [name, tensor] : file.tensors) {
    auto s = file.slices.find(name);
    if (s == file.slices.end()) continue;
    if (const std::string problem = placement_problem(s->second, tensor.numel()); !problem.empty())
      throw UserError(label + ": tensor '" + name + "' is placed with " + problem);
  }
  return file;
}

RankFile read_rank_file(const fs::path& path) {
  const std::shared_ptr<const MappedFile> mapped = MappedFile::open(path);
  RankFile file = read_rank_file(mapped->bytes(), mapped, path.string());
  file.mapping = mapped;
  return file;
}

}  // namespace

RankFile Checkpoint::read_rank(int rank) const {
  if (images_.empty()) return read_rank_file(dir_ / shard_name(rank));
  return read_rank_file(images_.at(static_cast<size_t>(rank)), keep_alive_, dir_.string() + " rank " + std::to_string(rank));
}

Checkpoint Checkpoint::from_images(const CheckpointMeta& meta, const std::string& label, std::vector<std::string_view> images,
                                   std::shared_ptr<const void> keep_alive) {
  Checkpoint checkpoint;
  checkpoint.meta_ = meta;
  checkpoint.dir_ = label;
  for (int r = 0; r < static_cast<int>(images.size()); ++r) checkpoint.ranks_.push_back(r);
  checkpoint.images_ = std::move(images);
  checkpoint.keep_alive_ = std::move(keep_alive);
  return checkpoint;
}

std::string shape_text(c10::IntArrayRef shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

Checkpoint Checkpoint::open(const fs::path& dir) { return open(dir, Checksums::Verify); }

Checkpoint Checkpoint::open(const fs::path& dir, Checksums checksums) {
  if (auto problem = checkpoint_problem(dir, checksums)) throw UserError("checkpoint " + dir.string() + ": " + *problem);
  nlohmann::json manifest = read_manifest(dir);
  Checkpoint checkpoint;
  try {
    checkpoint.meta_ = {manifest.at("step").get<int64_t>(), manifest.at("state_hash").get<std::string>(),
                        manifest.at("world_size").get<int64_t>()};
  } catch (const nlohmann::json::exception& e) {
    throw UserError("checkpoint " + dir.string() + ": manifest.json lacks step, state_hash or world_size");
  }
  checkpoint.dir_ = dir;
  for (int r = 0; r < checkpoint.meta_.world_size; ++r) {
    if (!manifest["files"].contains(shard_name(r)))
      throw UserError("checkpoint " + dir.string() + ": manifest.json lists no " + shard_name(r) + " though " +
                      std::to_string(checkpoint.meta_.world_size) + " ranks saved it");
    checkpoint.ranks_.push_back(r);
  }
  return checkpoint;
}

namespace {

// Positions in the whole tensor's row-major flattening of the elements a piece holds (a tensor
// without a placement is whole).
at::Tensor global_indices(const Placement* placement, int64_t numel) {
  return placement ? whole_positions(*placement, numel) : at::arange(numel, at::kLong);
}

bool has_block(const Placement* placement) { return placement && placement->has_block(); }

// Which elements of a request's target are filled. While every piece is a flat range of the
// whole tensor (whole tensors, fsdp and zero shards: the common case) the filled ranges are
// merged intervals; a piece that is a block (tensor parallel) marks elements, in a mask made the
// first time one arrives. A mask for every request was 8% of exporting GPT-2 124M.
class Coverage {
 public:
  explicit Coverage(int64_t numel) : numel_(numel) {}
  void add_range(int64_t from, int64_t to) {
    if (mask_.defined()) {
      mask_.narrow(0, from, to - from).fill_(true);
      return;
    }
    ranges_.emplace(from, to);
  }
  void add_mask(const at::Tensor& elements) {
    if (!mask_.defined()) {
      mask_ = at::zeros({numel_}, at::kBool);
      for (const auto& [from, to] : ranges_) mask_.narrow(0, from, to - from).fill_(true);
      ranges_.clear();
    }
    mask_.logical_or_(elements);
  }
  int64_t covered() const {
    if (mask_.defined()) return mask_.sum().item<int64_t>();
    int64_t count = 0, reached = 0;  // the union of the ranges, in order of their starts
    for (const auto& [from, to] : ranges_) {
      count += std::max<int64_t>(0, to - std::max(from, reached));
      reached = std::max(reached, to);
    }
    return count;
  }
  bool complete() const { return covered() == numel_; }

 private:
  int64_t numel_;
  std::multimap<int64_t, int64_t> ranges_;  // [from, to) by from
  at::Tensor mask_;
};

}  // namespace

void Checkpoint::fill(std::vector<TensorRequest>& requests, int prefer, const std::function<void()>& heartbeat) const {
  std::vector<int> order{std::find(ranks_.begin(), ranks_.end(), prefer) != ranks_.end() ? prefer : 0};
  for (int r : ranks_)
    if (r != order.front()) order.push_back(r);
  std::vector<Coverage> filled;
  std::vector<bool> done(requests.size(), false);
  for (size_t i = 0; i < requests.size(); ++i) {
    filled.emplace_back(requests[i].target.numel());
    done[i] = requests[i].target.numel() == 0;
  }
  auto all_done = [&] { return std::all_of(done.begin(), done.end(), [](bool d) { return d; }); };
  // Requests by name: a checkpoint of n tensors is matched in n log n, not n^2.
  std::multimap<std::string, size_t> by_name;
  for (size_t i = 0; i < requests.size(); ++i) by_name.emplace(requests[i].name, i);
  at::NoGradGuard no_grad;
  for (int rank : order) {
    if (all_done()) break;
    const RankFile file = read_rank(rank);
    for (const auto& [name, stored] : file.tensors) {
      if (heartbeat) heartbeat();
      auto found = file.slices.find(name);
      const Placement* stored_slice = found != file.slices.end() ? &found->second : nullptr;
      const std::vector<int64_t> whole_shape = stored_slice ? stored_slice->shape : stored.sizes().vec();
      for (auto [match, end] = by_name.equal_range(name); match != end; ++match) {
        const size_t i = match->second;
        TensorRequest& q = requests[i];
        if (done[i]) continue;
        const Placement* wanted = q.placement ? &*q.placement : nullptr;
        const std::vector<int64_t> wanted_shape = wanted ? wanted->shape : q.target.sizes().vec();
        if (wanted_shape != whole_shape || stored.scalar_type() != q.target.scalar_type())
          throw UserError("checkpoint " + dir_.string() + " holds '" + name + "' as " + std::string(c10::toString(stored.scalar_type())) +
                          " " + shape_text(whole_shape) + " but the job's is " + std::string(c10::toString(q.target.scalar_type())) +
                          " " + shape_text(wanted_shape));
        at::Tensor target = q.target.view(-1), source = stored.reshape(-1);
        if (!has_block(wanted) && !has_block(stored_slice)) {
          // Both flat ranges of the whole tensor: copy their overlap.
          const int64_t begin = wanted ? wanted->offset : 0, stored_begin = stored_slice ? stored_slice->offset : 0;
          const int64_t from = std::max(begin, stored_begin), to = std::min(begin + target.numel(), stored_begin + source.numel());
          if (from >= to) continue;
          target.narrow(0, from - begin, to - from).copy_(source.narrow(0, from - stored_begin, to - from));
          filled[i].add_range(from - begin, to - begin);
        } else if (!has_block(stored_slice)) {
          // A block wanted from a flat range [stored_begin, + numel) of the whole tensor (or all of
          // it): the positions wanted are offsets into the stored range.
          const at::Tensor want = global_indices(wanted, target.numel());
          const int64_t stored_begin = stored_slice ? stored_slice->offset : 0;
          const at::Tensor match = want.ge(stored_begin).logical_and_(want.lt(stored_begin + source.numel()));
          if (!match.any().item<bool>()) continue;
          target.index_put_({match}, source.index({want.index({match}) - stored_begin}));
          filled[i].add_mask(match);
        } else {
          // Blocks on both sides: match elements by their position in the whole tensor.
          const at::Tensor want = global_indices(wanted, target.numel());
          const at::Tensor have = global_indices(stored_slice, source.numel());
          if (have.numel() == 0) continue;
          const at::Tensor position = at::searchsorted(have, want).clamp_max(have.numel() - 1);
          const at::Tensor match = have.index({position}).eq(want);
          if (!match.any().item<bool>()) continue;
          target.index_put_({match}, source.index({position.index({match})}));
          filled[i].add_mask(match);
        }
        done[i] = filled[i].complete();
      }
      if (file.mapping) file.mapping->release_pages(stored.data_ptr(), stored.nbytes());
    }
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    if (done[i]) continue;
    const int64_t covered = filled[i].covered();
    if (covered == 0) throw UserError("checkpoint " + dir_.string() + " has no tensor '" + requests[i].name + "'");
    throw UserError("checkpoint " + dir_.string() + " holds only " + std::to_string(covered) + " of the " +
                    std::to_string(requests[i].target.numel()) + " elements of '" + requests[i].name + "' this rank needs");
  }
}

std::vector<StoredTensorInfo> Checkpoint::describe() const {
  std::vector<StoredTensorInfo> out;
  std::map<std::string, size_t> index;
  for (int rank : ranks_) {
    const RankFile file = read_rank(rank);
    for (const auto& [name, stored] : file.tensors) {
      auto slice = file.slices.find(name);
      auto [it, added] = index.emplace(name, out.size());
      if (added)
        out.push_back({name, stored.scalar_type(), slice != file.slices.end() ? slice->second.shape : stored.sizes().vec(), {}, {}, 0});
      StoredTensorInfo& info = out[it->second];
      (slice != file.slices.end() ? info.pieces_in : info.whole_in).push_back(rank);
      info.stored_elements += stored.numel();
    }
  }
  return out;
}

std::optional<Checkpoint> open_checkpoint_or_explain(const fs::path& dir, std::vector<std::string>& reasons,
                                                     Checkpoint::Checksums checksums) {
  try {
    return Checkpoint::open(dir, checksums);
  } catch (const UserError& e) {
    reasons.push_back(e.what());
    return std::nullopt;
  }
}

std::optional<std::string> checksum_problem_together(const Checkpoint& checkpoint, Communicator& world, c10::Device device,
                                                     const std::function<void()>& heartbeat) {
  if (checkpoint.in_memory()) return std::nullopt;  // flash images were verified as they arrived
  std::vector<std::pair<std::string, std::string>> files;  // name, SHA-256 the manifest gives
  const nlohmann::json manifest = read_manifest(checkpoint.path());
  for (const auto& [file, info] : manifest.at("files").items()) files.emplace_back(file, info.value("sha256", ""));
  // 1 + the index of the first file of this rank's share that fails, or 0.
  int failed = 0;
  size_t hashed = 0;
  uintmax_t bytes = 0;
  for (size_t i = static_cast<size_t>(world.rank()); i < files.size() && failed == 0; i += static_cast<size_t>(world.size())) {
    const fs::path path = checkpoint.path() / files[i].first;
    if (sha256_file(path, heartbeat) != files[i].second) failed = static_cast<int>(i) + 1;
    ++hashed, bytes += fs::file_size(path);
  }
  log::record("checksums of " + checkpoint.path().string() + ": this rank hashed " + std::to_string(hashed) + " of the " +
              std::to_string(files.size()) + " files (" + std::to_string(bytes) + " bytes), the other ranks the rest");
  at::Tensor agreed = at::tensor(failed, at::kInt).to(device);
  world.all_reduce(agreed, ReduceOp::Max)->wait();
  failed = agreed.cpu().item<int>();
  if (failed == 0) return std::nullopt;
  return files[static_cast<size_t>(failed - 1)].first + " fails its SHA-256 checksum";
}

std::optional<Checkpoint> open_newest_valid_checkpoint(const fs::path& checkpoints_dir,
                                                       const std::function<void(const std::string&)>& warn) {
  for (const auto& dir : step_dirs_newest_first(checkpoints_dir)) {
    try {
      return Checkpoint::open(dir);
    } catch (const UserError& e) {
      warn(std::string("skipping ") + e.what());
    }
  }
  return std::nullopt;
}

}  // namespace strata::engine
