// Defaults from a prepared data directory (strata/core/strategy.h: apply_prepared_data).
//
// `strata data prepare` writes DIR/meta.json ("format": "strata-tokens 1") beside the token files:
// the vocabulary, the end-of-text id and the token width. A strategy whose [data] path is such a
// directory need not repeat them: [model] vocab_size, [data] document_end, dtype and vocab_size
// are taken from it when the strategy leaves them out (their position names meta.json, so `strata
// plan` shows where they came from). [model] vocab_size yields to the model's own description
// (the config.json of the weights it starts from names the rows they have). A stated dtype or
// document_end other than the files' is
// refused naming both; a stated [model] vocab_size is kept (larger is a choice, padding for
// speed), and one below the data's is refused by the data check as for any dataset.
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "strata/core/prepared_data.h"

#include "strata/core/strategy.h"

namespace strata {

std::optional<PreparedData> read_prepared_data(const std::filesystem::path& dir) {
  PreparedData prepared{dir / "meta.json", {}, {}, {}, {}, {}};
  std::error_code unreadable;  // a path the system refuses (too long, no permission) is not prepared data
  if (!std::filesystem::is_regular_file(prepared.meta_file, unreadable)) return std::nullopt;
  std::ifstream in(prepared.meta_file);
  const nlohmann::json meta = nlohmann::json::parse(in, nullptr, false);
  if (meta.is_discarded() || !meta.is_object() || meta.value("format", "").rfind("strata-tokens ", 0) != 0) return std::nullopt;
  const auto integer = [&](const char* key) { return meta.contains(key) && meta[key].is_number_integer() ? std::optional(meta[key].get<int64_t>()) : std::nullopt; };
  const auto text = [&](const char* key) { return meta.contains(key) && meta[key].is_string() ? std::optional(meta[key].get<std::string>()) : std::nullopt; };
  prepared.vocab_size = integer("vocab_size"), prepared.eos_id = integer("eos_id");
  prepared.dtype = text("dtype"), prepared.eos_token = text("eos_token");
  if (std::filesystem::is_regular_file(dir / "tokenizer.json", unreadable)) prepared.tokenizer = dir / "tokenizer.json";
  return prepared;
}

std::vector<DerivesDefaults::Derived> apply_prepared_data(const Config& job, const ComponentRegistry& registry, RawSection& data,
                                                          Diagnostics& diagnostics) {
  const RawEntry* path = data.find("path");
  if (!path || !std::holds_alternative<std::string>(path->value)) return {};
  const std::optional<PreparedData> prepared = read_prepared_data(std::get<std::string>(path->value));
  if (!prepared) return {};
  const std::filesystem::path& meta_file = prepared->meta_file;
  const SourcePos from{meta_file.string(), 0, 0};
  if (!prepared->vocab_size || !prepared->eos_id || !prepared->dtype) {
    diagnostics.error(from, "prepared data: meta.json needs integer vocab_size and eos_id and a dtype (rewrite it with strata data prepare)");
    return {};
  }
  // Only a component that declares a key takes it (another's schema would refuse the key).
  auto fill = [&](const std::string& key, Value value) {
    const Component* component = job.has("dataset") ? registry.find(ComponentKind::Dataset, job.get_string("dataset")) : nullptr;
    if (component && component->info().schema.find(key) && !data.find(key)) data.set(key, RawEntry{std::move(value), from, Origin::File});
  };
  // A stated token width or document end other than the files' is refused, naming both: the
  // tokens would be misread or documents cut at a token that never ends one (-1, the stream as
  // one document, is a choice).
  const int64_t eos = *prepared->eos_id;
  const std::string dtype = *prepared->dtype;
  if (const RawEntry* stated = data.find("dtype"); stated && std::holds_alternative<std::string>(stated->value) && std::get<std::string>(stated->value) != dtype)
    diagnostics.error(stated->pos, "[data] dtype = \"" + std::get<std::string>(stated->value) + "\" but " + meta_file.string() + " says the tokens are " + dtype);
  if (const RawEntry* stated = data.find("document_end");
      stated && std::holds_alternative<int64_t>(stated->value) && std::get<int64_t>(stated->value) != eos && std::get<int64_t>(stated->value) != -1)
    diagnostics.error(stated->pos, "[data] document_end = " + std::to_string(std::get<int64_t>(stated->value)) + " but " + meta_file.string() +
                                       " says documents end with " + std::to_string(eos) + " (" + prepared->eos_token.value_or("") + ")");
  fill("document_end", Value{eos});
  fill("dtype", Value{dtype});
  fill("vocab_size", Value{*prepared->vocab_size});
  return {{"vocab_size", Value{*prepared->vocab_size}, from}};
}

}  // namespace strata
