#include "checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

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

void save_checkpoint(const fs::path& checkpoints_dir, const CheckpointMeta& meta, const NamedTensors& tensors, int64_t keep,
                     Communicator& world) {
  const std::string name = step_dir_name(meta.step);
  const fs::path staging = checkpoints_dir / (".tmp-" + name);
  const bool leader = world.rank() == 0;
  if (leader) {
    fs::create_directories(checkpoints_dir);
    fs::remove_all(staging);
    fs::create_directories(staging);
  }
  world.barrier()->wait();
  write_safetensors(staging / shard_name(world.rank()), tensors, {{"format", kFormat}, {"step", std::to_string(meta.step)}});
  world.barrier()->wait();
  if (!leader) {
    world.barrier()->wait();  // until rank 0 has published it
    return;
  }
  nlohmann::json files = nlohmann::json::object();
  for (int r = 0; r < world.size(); ++r) {
    const fs::path shard = staging / shard_name(r);
    files[shard_name(r)] = {{"bytes", fs::file_size(shard)}, {"sha256", sha256_file(shard)}};
  }
  nlohmann::json manifest = {{"format", kFormat},
                             {"step", meta.step},
                             {"config_hash", meta.config_hash},
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

LoadedCheckpoint load_checkpoint(const fs::path& dir, int rank) {
  if (auto problem = checkpoint_problem(dir)) throw UserError("checkpoint " + dir.string() + ": " + *problem);
  nlohmann::json manifest = read_manifest(dir);
  LoadedCheckpoint loaded;
  try {
    loaded.meta = {manifest.at("step").get<int64_t>(), manifest.at("config_hash").get<std::string>(),
                   manifest.at("world_size").get<int64_t>()};
  } catch (const nlohmann::json::exception& e) {
    throw UserError("checkpoint " + dir.string() + ": manifest.json lacks step, config_hash or world_size");
  }
  loaded.path = dir;
  if (!manifest["files"].contains(shard_name(rank)))
    throw UserError("checkpoint " + dir.string() + " has no shard for rank " + std::to_string(rank) + " (it was saved by " +
                    std::to_string(loaded.meta.world_size) + " ranks)");
  loaded.tensors = read_safetensors(dir / shard_name(rank));
  return loaded;
}

std::optional<LoadedCheckpoint> load_newest_valid_checkpoint(const fs::path& checkpoints_dir, int rank,
                                                             const std::function<void(const std::string&)>& warn) {
  for (const auto& dir : step_dirs_newest_first(checkpoints_dir)) {
    try {
      return load_checkpoint(dir, rank);
    } catch (const UserError& e) {
      warn(std::string("skipping ") + e.what());
    }
  }
  return std::nullopt;
}

}  // namespace strata::engine
