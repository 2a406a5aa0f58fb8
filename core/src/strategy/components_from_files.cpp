// [job] model and dataset from the files a strategy names (components_from_files.h).
#include "components_from_files.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

#include "strata/core/prepared_data.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

const std::string* raw_string(const RawSection& section, const std::string& key) {
  const RawEntry* entry = section.find(key);
  return entry ? std::get_if<std::string>(&entry->value) : nullptr;
}

void choose_model(RawSection& job, const RawSection& model, const ComponentRegistry& registry) {
  const std::string* init_from = raw_string(model, "init_from");
  if (job.find("model") || !init_from || init_from->empty()) return;
  const fs::path file = beside_weights(*init_from, "config.json");
  if (file.empty()) return;
  std::ifstream in(file);
  const nlohmann::json config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object() || !config.contains("model_type") || !config["model_type"].is_string()) return;
  const std::vector<std::string> loaders = models_loading(config["model_type"].get<std::string>(), registry);
  if (loaders.size() == 1) job.set("model", RawEntry{loaders.front(), SourcePos{file.string(), 0, 0}, Origin::File});
}

// The file that says which bundled dataset reads `path`, and that dataset; empty where none does.
// A prepared directory's meta.json and a directory of train.bin and val.bin are token files
// (nanoGPT's layout too); a .txt file, or a directory holding .txt files, is text.
std::pair<std::string, fs::path> dataset_reading(const std::string& path) {
  if (const std::optional<PreparedData> prepared = read_prepared_data(path)) return {"tokens", prepared->meta_file};
  std::error_code unreadable;
  const fs::path given(path);
  if (fs::is_regular_file(given, unreadable)) {
    if (given.extension() == ".txt") return {"text", given};
    if (given.extension() == ".bin") return {"tokens", given};
    return {};
  }
  if (!fs::is_directory(given, unreadable)) return {};
  if (fs::is_regular_file(given / "train.bin", unreadable) && fs::is_regular_file(given / "val.bin", unreadable))
    return {"tokens", given / "train.bin"};
  for (const auto& entry : fs::directory_iterator(given, unreadable))
    if (entry.path().extension() == ".txt" && entry.is_regular_file(unreadable)) return {"text", given};
  return {};
}

void choose_dataset(RawSection& job, const RawSection& data, const ComponentRegistry& registry) {
  const std::string* path = raw_string(data, "path");
  if (job.find("dataset") || !path || path->empty()) return;
  const auto [dataset, file] = dataset_reading(*path);
  if (!dataset.empty() && registry.find(ComponentKind::Dataset, dataset))
    job.set("dataset", RawEntry{dataset, SourcePos{file.string(), 0, 0}, Origin::File});
}

}  // namespace

std::vector<std::string> models_loading(const std::string& model_type, const ComponentRegistry& registry) {
  std::vector<std::string> loaders;
  for (const auto& name : registry.names(ComponentKind::Model)) {
    const auto* loads = dynamic_cast<const LoadsHfModelTypes*>(registry.find(ComponentKind::Model, name));
    if (!loads) continue;
    const std::vector<std::string> types = loads->hf_model_types();
    if (std::find(types.begin(), types.end(), model_type) != types.end()) loaders.push_back(name);
  }
  return loaders;
}

fs::path beside_weights(const std::string& init_from, const std::string& name) {
  std::error_code unreadable;
  const fs::path path(init_from);
  const fs::path file = fs::is_directory(path, unreadable) ? path / name : path.parent_path() / name;
  return fs::is_regular_file(file, unreadable) ? file : fs::path();
}

void choose_components_from_files(RawSection& job, const RawSection& model, const RawSection& data,
                                  const ComponentRegistry& registry) {
  choose_model(job, model, registry);
  choose_dataset(job, data, registry);
}

}  // namespace strata
