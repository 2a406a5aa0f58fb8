#include "strata/interchange.h"

#include <fstream>
#include <map>
#include <set>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "strata/errors.h"
#include "strata/model.h"
#include "strata/core/safetensors.h"
#include "strata/core/safetensors_view.h"

namespace strata {

namespace fs = std::filesystem;

std::shared_ptr<nn::Model> ModelFactory::create_shard(const Config& config, nn::TensorShard shard) const {
  if (shard.parts != 1)
    throw UserError("model '" + name() + "' cannot be built split over " + std::to_string(shard.parts) +
                    " tensor-parallel ranks (its factory does not implement create_shard)");
  return create(config);
}

std::string ModelFactory::split_problem(const Config&, int64_t parts) const {
  return parts == 1 ? std::string()
                    : "model '" + name() + "' cannot be split over tensor-parallel ranks (its factory does not implement create_shard)";
}

std::string ModelFactory::describe_split(const Config&, int64_t) const { return {}; }

ModelShape ModelFactory::shape(const Config& config) const {
  ModelShape out;
  for (const auto& p : create(config)->parameters())
    if (p.requires_grad()) out.parameters += p.numel();
  return out;
}

NamedTensors ModelFactory::to_hf(const nn::Model&, const Config&) const {
  throw UserError("model '" + name() + "' has no Hugging Face equivalent to export to");
}
NamedTensors ModelFactory::from_hf(const NamedTensors&, const Config&) const {
  throw UserError("model '" + name() + "' cannot import Hugging Face weights");
}
std::string ModelFactory::hf_config_json(const Config&) const {
  throw UserError("model '" + name() + "' has no Hugging Face equivalent to export to");
}

namespace {

// The files of a Hugging Face checkpoint and, for a sharded one, the names each must hold.
struct CheckpointFile {
  fs::path path;
  std::set<std::string> names;  // empty: every tensor of the file
};

std::vector<CheckpointFile> checkpoint_files(const fs::path& path) {
  if (fs::is_regular_file(path)) return {{path, {}}};
  if (!fs::is_directory(path)) throw UserError("Hugging Face checkpoint " + path.string() + " does not exist");
  if (fs::is_regular_file(path / "model.safetensors")) return {{path / "model.safetensors", {}}};
  const fs::path index_path = path / "model.safetensors.index.json";
  std::ifstream in(index_path);
  if (!in) {
    // Older hub repositories hold only PyTorch's pickles, which are not read here (a pickle runs code).
    const bool pickles = fs::is_regular_file(path / "pytorch_model.bin") || fs::is_regular_file(path / "pytorch_model.bin.index.json");
    throw UserError(path.string() + " holds neither model.safetensors nor model.safetensors.index.json" +
                    (pickles ? std::string("; its pytorch_model.bin is a pickle, which Strata does not read: transformers' "
                                           "from_pretrained(DIR).save_pretrained(OUT) writes it as safetensors")
                             : std::string()));
  }
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(index_path.string() + " is not valid JSON: " + e.what());
  }
  if (!index.contains("weight_map") || !index["weight_map"].is_object())
    throw UserError(index_path.string() + " has no weight_map object");
  std::map<std::string, std::set<std::string>> wanted;  // shard -> names
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
      throw UserError(index_path.string() + ": weight_map entry '" + name + "' does not name a file beside the index");
    wanted[file.get<std::string>()].insert(name);
  }
  std::vector<CheckpointFile> out;
  for (auto& [file, names] : wanted) out.push_back({path / file, std::move(names)});
  return out;
}

// The tensors of `shard` that `file` lists (all of them for a single file); an index entry its
// file lacks is an error naming both.
void take_listed(const CheckpointFile& file, NamedTensors&& shard, NamedTensors& out) {
  if (file.names.empty()) {
    for (auto& named : shard) out.push_back(std::move(named));
    return;
  }
  std::set<std::string> found;
  for (auto& [name, tensor] : shard)
    if (file.names.count(name)) out.emplace_back(name, tensor), found.insert(name);
  for (const auto& name : file.names)
    if (!found.count(name))
      throw UserError((file.path.parent_path() / "model.safetensors.index.json").string() + " puts '" + name + "' in " +
                      file.path.filename().string() + ", which lacks it");
}

}  // namespace

NamedTensors read_hf_checkpoint(const fs::path& path) {
  NamedTensors out;
  for (const auto& file : checkpoint_files(path)) take_listed(file, read_safetensors(file.path), out);
  return out;
}

struct MappedHfCheckpoint::Files {
  std::vector<std::shared_ptr<const MappedFile>> mapped;
};

MappedHfCheckpoint::MappedHfCheckpoint(const fs::path& path) {
  auto files = std::make_shared<Files>();
  for (const auto& file : checkpoint_files(path)) {
    auto mapped = MappedFile::open(file.path);
    files->mapped.push_back(mapped);
    take_listed(file, view_safetensors(mapped->bytes(), mapped, file.path.string()), tensors_);
  }
  files_ = std::move(files);
}

MappedHfCheckpoint::~MappedHfCheckpoint() = default;

const NamedTensors& MappedHfCheckpoint::tensors() const { return tensors_; }

void MappedHfCheckpoint::release(const at::Tensor& view) const {
  // Each mapping ignores a range outside it (and a tensor copied for its alignment lies outside all).
  for (const auto& file : files_->mapped) file->release_pages(view.data_ptr(), view.nbytes());
}

void load_parameters(nn::Model& model, const NamedTensors& tensors, const std::string& source) {
  std::map<std::string, at::Tensor> given;
  for (const auto& [name, tensor] : tensors)
    if (!given.emplace(name, tensor).second) throw UserError(source + " gives tensor '" + name + "' twice");
  at::NoGradGuard no_grad;
  for (auto& p : model.named_parameters()) {
    auto it = given.find(p.key());
    if (it == given.end()) throw UserError(source + " has no tensor for parameter '" + p.key() + "'");
    if (it->second.sizes() != p.value().sizes())
      throw UserError(source + ": tensor for '" + p.key() + "' has shape " + c10::str(it->second.sizes()) + ", the model needs " +
                      c10::str(p.value().sizes()));
    // Weights convert between float dtypes (bf16 to fp32); integers or booleans are not weights,
    // and a NaN or infinity would train to NaN.
    if (!at::isFloatingType(it->second.scalar_type()))
      throw UserError(source + ": tensor for '" + p.key() + "' is " + c10::toString(it->second.scalar_type()) +
                      ", not a floating-point dtype");
    if (!at::isfinite(it->second).all().item<bool>())
      throw UserError(source + ": tensor for '" + p.key() + "' holds NaN or infinite values");
    p.value().copy_(it->second);
    given.erase(it);
  }
  if (!given.empty()) throw UserError(source + " has tensor '" + given.begin()->first + "', which the model does not use");
}

}  // namespace strata
