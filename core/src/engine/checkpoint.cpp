#include "checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>
#include <nlohmann/json.hpp>

#include "../sha256.h"
#include "strata/safetensors.h"
#include "strata/errors.h"

namespace strata::engine {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "strata-checkpoint-1";

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08ld", static_cast<long>(step));
  return buf;
}

void fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

void write_text_durably(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    if (!out.flush()) throw UserError("cannot write " + tmp.string());
  }
  int fd = ::open(tmp.c_str(), O_RDONLY);
  if (fd >= 0) ::fsync(fd), ::close(fd);
  fs::rename(tmp, path);
  fsync_dir(path.parent_path());
}

std::vector<fs::path> step_dirs_newest_first(const fs::path& checkpoints_dir) {
  std::vector<fs::path> dirs;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(checkpoints_dir, ec))
    if (entry.is_directory() && entry.path().filename().string().rfind("step_", 0) == 0) dirs.push_back(entry.path());
  std::sort(dirs.rbegin(), dirs.rend());
  return dirs;
}

nlohmann::json read_manifest(const fs::path& dir) {
  std::ifstream in(dir / "manifest.json");
  if (!in) throw UserError("no manifest.json");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(std::string("manifest.json is not valid JSON: ") + e.what());
  }
}

}  // namespace

std::string shard_name(int rank) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "rank_%05d.safetensors", rank);
  return buf;
}

void save_checkpoint(const fs::path& checkpoints_dir, const CheckpointMeta& meta, const NamedTensors& tensors,
                     const Slices& slices, int64_t keep, Communicator& world, c10::Device device) {
  const std::string name = step_dir_name(meta.step);
  const fs::path staging = checkpoints_dir / (".tmp-" + name);
  const bool leader = world.rank() == 0;
  if (leader) {
    fs::create_directories(checkpoints_dir);
    fs::remove_all(staging);
    fs::create_directories(staging);
  }
  world.barrier()->wait();
  nlohmann::json slice_json = nlohmann::json::object();
  for (const auto& [name, slice] : slices) slice_json[name] = {{"shape", slice.shape}, {"offset", slice.offset}};
  const fs::path own = staging / shard_name(world.rank());
  write_safetensors(own, tensors, {{"format", kFormat}, {"step", std::to_string(meta.step)}, {"slices", slice_json.dump()}});
  // Each rank hashes what it wrote, in parallel; rank 0 collects 64 hex digits and 8 size bytes
  // per rank rather than reading every file again.
  constexpr int64_t kRecord = 72;
  const std::string digest = sha256_file(own);
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
  nlohmann::json files = nlohmann::json::object();
  for (int r = 0; r < world.size(); ++r) {
    const auto* record = static_cast<const uint8_t*>(all.data_ptr()) + kRecord * r;
    uint64_t size = 0;
    std::memcpy(&size, record + 64, 8);
    files[shard_name(r)] = {{"bytes", size}, {"sha256", std::string(reinterpret_cast<const char*>(record), 64)}};
  }
  nlohmann::json manifest = {{"format", kFormat},
                             {"step", meta.step},
                             {"state_hash", meta.state_hash},
                             {"world_size", meta.world_size},
                             {"files", files}};
  write_text_durably(staging / "manifest.json", manifest.dump(2) + "\n");
  fsync_dir(staging);

  const fs::path final_dir = checkpoints_dir / name;
  fs::remove_all(final_dir);
  fs::rename(staging, final_dir);
  fsync_dir(checkpoints_dir);
  write_text_durably(checkpoints_dir / "latest", name + "\n");

  std::vector<fs::path> dirs = step_dirs_newest_first(checkpoints_dir);
  for (size_t i = static_cast<size_t>(keep); i < dirs.size(); ++i) fs::remove_all(dirs[i]);
  world.barrier()->wait();
}

std::optional<std::string> checkpoint_problem(const fs::path& dir) {
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
      if (sha256_file(path) != info.value("sha256", "")) return file + " fails its SHA-256 checksum";
    }
  } catch (const std::exception& e) {
    return e.what();
  }
  return std::nullopt;
}

namespace {

// One rank's file, read whole: its tensors and which of them are slices.
struct RankFile {
  NamedTensors tensors;
  Slices slices;
};

RankFile read_rank_file(const fs::path& path) {
  Metadata metadata;
  RankFile file{read_safetensors(path, &metadata), {}};
  auto it = metadata.find("slices");
  if (it == metadata.end()) return file;
  try {
    const nlohmann::json slices = nlohmann::json::parse(it->second);
    for (const auto& [name, info] : slices.items())
      file.slices[name] = Slice{info.at("shape").get<std::vector<int64_t>>(), info.at("offset").get<int64_t>()};
  } catch (const nlohmann::json::exception& e) {
    throw UserError(path.string() + ": its slices metadata is malformed: " + e.what());
  }
  for (const auto& [name, tensor] : file.tensors) {
    auto s = file.slices.find(name);
    if (s == file.slices.end()) continue;
    const int64_t whole = c10::multiply_integers(s->second.shape);
    if (s->second.offset < 0 || s->second.offset + tensor.numel() > whole)
      throw UserError(path.string() + ": tensor '" + name + "' claims elements past the end of its whole tensor");
  }
  return file;
}

// Element ranges [begin, end) of the flattened whole tensor that a request has received.
class Coverage {
 public:
  void add(int64_t begin, int64_t end) {
    ranges_.emplace_back(begin, end);
    std::sort(ranges_.begin(), ranges_.end());
    std::vector<std::pair<int64_t, int64_t>> merged;
    for (const auto& r : ranges_)
      if (!merged.empty() && r.first <= merged.back().second)
        merged.back().second = std::max(merged.back().second, r.second);
      else
        merged.push_back(r);
    ranges_ = std::move(merged);
  }
  bool covers(int64_t begin, int64_t end) const {
    return begin == end || (ranges_.size() == 1 && ranges_[0].first <= begin && ranges_[0].second >= end);
  }
  int64_t covered() const {
    int64_t n = 0;
    for (const auto& r : ranges_) n += r.second - r.first;
    return n;
  }

 private:
  std::vector<std::pair<int64_t, int64_t>> ranges_;
};

}  // namespace

std::string shape_text(c10::IntArrayRef shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

Checkpoint Checkpoint::open(const fs::path& dir) {
  if (auto problem = checkpoint_problem(dir)) throw UserError("checkpoint " + dir.string() + ": " + *problem);
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

void Checkpoint::fill(std::vector<TensorRequest>& requests, int prefer) const {
  std::vector<int> order{std::find(ranks_.begin(), ranks_.end(), prefer) != ranks_.end() ? prefer : 0};
  for (int r : ranks_)
    if (r != order.front()) order.push_back(r);
  std::vector<Coverage> coverage(requests.size());
  auto range_of = [](const TensorRequest& q) {
    const int64_t begin = q.slice ? q.slice->offset : 0;
    return std::pair<int64_t, int64_t>(begin, begin + q.target.numel());
  };
  auto complete = [&](size_t i) {
    auto [begin, end] = range_of(requests[i]);
    return coverage[i].covers(begin, end);
  };
  at::NoGradGuard no_grad;
  for (int rank : order) {
    bool all = true;
    for (size_t i = 0; i < requests.size() && all; ++i) all = complete(i);
    if (all) break;
    const fs::path path = dir_ / shard_name(rank);
    const RankFile file = read_rank_file(path);
    for (const auto& [name, stored] : file.tensors) {
      auto slice = file.slices.find(name);
      const std::vector<int64_t> whole_shape = slice != file.slices.end() ? slice->second.shape : stored.sizes().vec();
      const int64_t stored_begin = slice != file.slices.end() ? slice->second.offset : 0;
      for (size_t i = 0; i < requests.size(); ++i) {
        TensorRequest& q = requests[i];
        if (q.name != name || complete(i)) continue;
        const std::vector<int64_t> wanted_shape = q.slice ? q.slice->shape : q.target.sizes().vec();
        if (wanted_shape != whole_shape || stored.scalar_type() != q.target.scalar_type())
          throw UserError("checkpoint " + dir_.string() + " holds '" + name + "' as " + std::string(c10::toString(stored.scalar_type())) +
                          " " + shape_text(whole_shape) + " but the job's is " + std::string(c10::toString(q.target.scalar_type())) +
                          " " + shape_text(wanted_shape));
        auto [begin, end] = range_of(q);
        const int64_t from = std::max(begin, stored_begin), to = std::min(end, stored_begin + stored.numel());
        if (from >= to) continue;
        q.target.view(-1).narrow(0, from - begin, to - from).copy_(stored.reshape(-1).narrow(0, from - stored_begin, to - from));
        coverage[i].add(from, to);
      }
    }
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    if (complete(i)) continue;
    auto [begin, end] = range_of(requests[i]);
    if (coverage[i].covered() == 0)
      throw UserError("checkpoint " + dir_.string() + " has no tensor '" + requests[i].name + "'");
    throw UserError("checkpoint " + dir_.string() + " holds only " + std::to_string(coverage[i].covered()) + " of the " +
                    std::to_string(end - begin) + " elements of '" + requests[i].name + "' this rank needs");
  }
}

std::vector<StoredTensorInfo> Checkpoint::describe() const {
  std::vector<StoredTensorInfo> out;
  std::map<std::string, size_t> index;
  for (int rank : ranks_) {
    const RankFile file = read_rank_file(dir_ / shard_name(rank));
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
