// Prepared data and the weights it fine-tunes share one tokenizer (tokenizer_check.h).
#include "tokenizer_check.h"

#include <fstream>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>

#include "../checkpoint/tokenizer_export.h"
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

// The first id the two tokenizers name differently, with what each names there.
struct Disagreement {
  int64_t id = 0;
  std::optional<std::string> weights, data;
};

std::optional<Disagreement> first_disagreement(const std::map<int64_t, std::string>& weights, const std::map<int64_t, std::string>& data) {
  for (auto a = weights.begin(), b = data.begin(); a != weights.end() || b != data.end(); ++a, ++b) {
    if (a != weights.end() && b != data.end() && *a == *b) continue;
    const int64_t id = a == weights.end() ? b->first : b == data.end() ? a->first : std::min(a->first, b->first);
    Disagreement d{id, {}, {}};
    if (auto it = weights.find(id); it != weights.end()) d.weights = it->second;
    if (auto it = data.find(id); it != data.end()) d.data = it->second;
    return d;
  }
  return std::nullopt;
}

// The text dataset's ids are bytes: what a byte-level run's export names them (only ids 0..255
// occur in its data, so only they must agree).
std::map<int64_t, std::string> byte_ids() {
  std::map<int64_t, std::string> ids;
  for (int b = 0; b < 256; ++b) ids[b] = byte_as_character(b);
  return ids;
}

}  // namespace

void check_data_tokenizer_matches_weights(const Config& job, const RawSection& model, const RawSection& data, Diagnostics& diagnostics) {
  const RawEntry* init_from = model.find("init_from");
  const RawEntry* path = data.find("path");
  if (!init_from || !path || !std::holds_alternative<std::string>(init_from->value) || !std::holds_alternative<std::string>(path->value)) return;
  const std::filesystem::path weights_file = beside_weights(std::get<std::string>(init_from->value), "tokenizer.json");
  const std::optional<std::map<int64_t, std::string>> weights = weights_file.empty() ? std::nullopt : ids_of(weights_file);
  if (!weights) return;
  const std::string& data_file = std::get<std::string>(path->value);
  const std::string prepare = "`strata data prepare " + data_file + " -o DIR --tokenizer " + weights_file.string() + "`";
  if (job.has("dataset") && job.get_string("dataset") == "text") {
    std::map<int64_t, std::string> weights_bytes(weights->begin(), weights->lower_bound(256));
    if (const std::optional<Disagreement> d = first_disagreement(weights_bytes, byte_ids()))
      diagnostics.error(path->pos, "[data] path: the text dataset's token ids are bytes, but the weights' " + weights_file.string() +
                                       " is another tokenizer (id " + std::to_string(d->id) + " is " + quoted(d->weights) + " for the weights, byte " +
                                       quoted(d->data) + " in the data): tokenize the text with it, " + prepare + ", and train on DIR");
    return;
  }
  const std::optional<PreparedData> prepared = read_prepared_data(data_file);
  if (!prepared || prepared->tokenizer.empty()) return;
  const auto data_ids = ids_of(prepared->tokenizer);
  if (!data_ids) return;
  if (const std::optional<Disagreement> d = first_disagreement(*weights, *data_ids))
    diagnostics.error(path->pos, "[data] path: " + prepared->tokenizer.string() + " made these tokens, another tokenizer than the weights' " +
                                     weights_file.string() + " (id " + std::to_string(d->id) + " is " + quoted(d->data) + " in the data, " +
                                     quoted(d->weights) + " for the weights): prepare the data with `strata data prepare ... --tokenizer " +
                                     weights_file.string() + "`");
}

}  // namespace strata
