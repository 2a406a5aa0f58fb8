// Defaults from a prepared data directory (strata/core/strategy.h: apply_prepared_data).
//
// `strata data prepare` writes DIR/meta.json ("format": "strata-tokens 1") beside the token files:
// the vocabulary, the end-of-text id and the token width. A strategy whose [data] path is such a
// directory need not repeat them: [model] vocab_size, [data] document_end, dtype and vocab_size
// are taken from it when the strategy leaves them out (their position names meta.json, so `strata
// plan` shows where they came from). A stated dtype or document_end other than the files' is
// refused naming both; a stated [model] vocab_size is kept (larger is a choice, padding for
// speed), and one below the data's is refused by the data check as for any dataset.
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "strata/core/strategy.h"

namespace strata {

void apply_prepared_data(const Config& job, const ComponentRegistry& registry, RawSection& model, RawSection& data, Diagnostics& diagnostics) {
  const RawEntry* path = data.find("path");
  if (!path || !std::holds_alternative<std::string>(path->value)) return;
  const std::filesystem::path meta_file = std::filesystem::path(std::get<std::string>(path->value)) / "meta.json";
  std::error_code unreadable;  // a path the system refuses (too long, no permission) is not prepared data
  if (!std::filesystem::is_regular_file(meta_file, unreadable)) return;
  std::ifstream in(meta_file);
  const nlohmann::json meta = nlohmann::json::parse(in, nullptr, false);
  if (meta.is_discarded() || meta.value("format", "").rfind("strata-tokens ", 0) != 0) return;
  const SourcePos from{meta_file.string(), 0, 0};
  if (!meta.contains("vocab_size") || !meta["vocab_size"].is_number_integer() || !meta.contains("eos_id") ||
      !meta["eos_id"].is_number_integer() || !meta.contains("dtype") || !meta["dtype"].is_string()) {
    diagnostics.error(from, "prepared data: meta.json needs integer vocab_size and eos_id and a dtype (rewrite it with strata data prepare)");
    return;
  }
  // Only a component that declares a key takes it (another's schema would refuse the key).
  auto fill = [&](ComponentKind kind, const char* chooser, RawSection& section, const std::string& key, Value value) {
    const Component* component = job.has(chooser) ? registry.find(kind, job.get_string(chooser)) : nullptr;
    if (component && component->info().schema.find(key) && !section.find(key)) section.set(key, RawEntry{std::move(value), from, Origin::File});
  };
  // A stated token width or document end other than the files' is refused, naming both: the
  // tokens would be misread or documents cut at a token that never ends one (-1, the stream as
  // one document, is a choice).
  const int64_t eos = meta["eos_id"].get<int64_t>();
  const std::string dtype = meta["dtype"].get<std::string>();
  if (const RawEntry* stated = data.find("dtype"); stated && std::holds_alternative<std::string>(stated->value) && std::get<std::string>(stated->value) != dtype)
    diagnostics.error(stated->pos, "[data] dtype = \"" + std::get<std::string>(stated->value) + "\" but " + meta_file.string() + " says the tokens are " + dtype);
  if (const RawEntry* stated = data.find("document_end");
      stated && std::holds_alternative<int64_t>(stated->value) && std::get<int64_t>(stated->value) != eos && std::get<int64_t>(stated->value) != -1)
    diagnostics.error(stated->pos, "[data] document_end = " + std::to_string(std::get<int64_t>(stated->value)) + " but " + meta_file.string() +
                                       " says documents end with " + std::to_string(eos) + " (" + meta.value("eos_token", "") + ")");
  fill(ComponentKind::Dataset, "dataset", data, "document_end", Value{eos});
  fill(ComponentKind::Dataset, "dataset", data, "dtype", Value{dtype});
  fill(ComponentKind::Dataset, "dataset", data, "vocab_size", Value{meta["vocab_size"].get<int64_t>()});
  fill(ComponentKind::Model, "model", model, "vocab_size", Value{meta["vocab_size"].get<int64_t>()});
}

}  // namespace strata
