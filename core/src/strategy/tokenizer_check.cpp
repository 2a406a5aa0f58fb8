// Prepared data and the weights it fine-tunes share one tokenizer (tokenizer_check.h).
#include "tokenizer_check.h"

#include <fstream>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>

#include "components_from_files.h"
#include "strata/core/prepared_data.h"

namespace strata {
namespace {

using json = nlohmann::json;

// Which id names which string: the model's vocabulary and the added tokens; nullopt for a file
// that is not a tokenizer.json (the tokenizer library reports that where it reads the file).
std::optional<std::map<int64_t, std::string>> ids_of(const std::filesystem::path& file) {
  std::ifstream in(file);
  const json tokenizer = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!tokenizer.is_object() || !tokenizer.contains("model") || !tokenizer["model"].is_object()) return std::nullopt;
  std::map<int64_t, std::string> ids;
  const json& vocab = tokenizer["model"].value("vocab", json());
  if (vocab.is_object()) {  // BPE, WordPiece, WordLevel: token -> id
    for (const auto& [token, id] : vocab.items())
      if (id.is_number_integer()) ids[id.get<int64_t>()] = token;
  } else if (vocab.is_array()) {  // Unigram: [token, score] in id order
    for (size_t id = 0; id < vocab.size(); ++id)
      if (vocab[id].is_array() && !vocab[id].empty() && vocab[id][0].is_string()) ids[static_cast<int64_t>(id)] = vocab[id][0].get<std::string>();
  } else {
    return std::nullopt;
  }
  for (const json& added : tokenizer.value("added_tokens", json::array()))
    if (added.is_object() && added.value("id", json()).is_number_integer() && added.value("content", json()).is_string())
      ids[added["id"].get<int64_t>()] = added["content"].get<std::string>();
  return ids;
}

std::string quoted(const std::optional<std::string>& token) { return token ? json(*token).dump() : std::string("no token"); }

}  // namespace

void check_data_tokenizer_matches_weights(const RawSection& model, const RawSection& data, Diagnostics& diagnostics) {
  const RawEntry* init_from = model.find("init_from");
  const RawEntry* path = data.find("path");
  if (!init_from || !path || !std::holds_alternative<std::string>(init_from->value) || !std::holds_alternative<std::string>(path->value)) return;
  const std::filesystem::path weights_file = beside_weights(std::get<std::string>(init_from->value), "tokenizer.json");
  const std::optional<PreparedData> prepared = read_prepared_data(std::get<std::string>(path->value));
  if (weights_file.empty() || !prepared || prepared->tokenizer.empty()) return;
  const auto weights = ids_of(weights_file), data_ids = ids_of(prepared->tokenizer);
  if (!weights || !data_ids || *weights == *data_ids) return;
  // The first id the two disagree on, for the message.
  int64_t id = 0;
  std::optional<std::string> theirs, ours;
  for (auto a = weights->begin(), b = data_ids->begin();; ++a, ++b) {
    if (a == weights->end() || b == data_ids->end() || *a != *b) {
      id = a == weights->end() ? b->first : b == data_ids->end() ? a->first : std::min(a->first, b->first);
      break;
    }
  }
  if (auto it = weights->find(id); it != weights->end()) theirs = it->second;
  if (auto it = data_ids->find(id); it != data_ids->end()) ours = it->second;
  diagnostics.error(path->pos, "[data] path: " + prepared->tokenizer.string() + " made these tokens, another tokenizer than the weights' " +
                                   weights_file.string() + " (id " + std::to_string(id) + " is " + quoted(ours) + " in the data, " + quoted(theirs) +
                                   " for the weights): prepare the data with `strata data prepare ... --tokenizer " + weights_file.string() + "`");
}

}  // namespace strata
