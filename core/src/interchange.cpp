#include "strata/interchange.h"

#include <fstream>
#include <map>
#include <set>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "strata/errors.h"
#include "strata/model.h"
#include "strata/safetensors.h"

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

NamedTensors read_hf_checkpoint(const fs::path& path) {
  if (fs::is_regular_file(path)) return read_safetensors(path);
  if (!fs::is_directory(path)) throw UserError("Hugging Face checkpoint " + path.string() + " does not exist");
  if (fs::is_regular_file(path / "model.safetensors")) return read_safetensors(path / "model.safetensors");
  const fs::path index_path = path / "model.safetensors.index.json";
  std::ifstream in(index_path);
  if (!in) throw UserError(path.string() + " holds neither model.safetensors nor model.safetensors.index.json");
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
  NamedTensors out;
  for (const auto& [file, names] : wanted) {
    NamedTensors shard = read_safetensors(path / file);
    std::set<std::string> found;
    for (auto& [name, tensor] : shard)
      if (names.count(name)) out.emplace_back(name, tensor), found.insert(name);
    for (const auto& name : names)
      if (!found.count(name)) throw UserError(index_path.string() + " puts '" + name + "' in " + file + ", which lacks it");
  }
  return out;
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
