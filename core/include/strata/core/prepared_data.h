// A directory `strata data prepare` wrote: the token files, meta.json ("format": "strata-tokens 1",
// the vocabulary, the end-of-text id and token, the token width) and the tokenizer.json they were
// made with. The one reader of that layout: the strategy's defaults (apply_prepared_data), the
// tokenizer an export carries and `strata sample` all ask it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "strata/component.h"
#include "strata/core/strategy.h"
#include "strata/export.h"

namespace strata {

struct PreparedData {
  std::filesystem::path meta_file;
  // Absent when meta.json lacks them or gives another type (a damaged or hand-edited file).
  std::optional<int64_t> vocab_size, eos_id;
  std::optional<std::string> dtype, eos_token;
  std::filesystem::path tokenizer;  // DIR/tokenizer.json, or empty when there is none
};

// What `dir` holds if `strata data prepare` wrote it; nullopt when it has no readable meta.json
// of the "strata-tokens" format (any other directory or file, or a path the system refuses).
STRATA_API std::optional<PreparedData> read_prepared_data(const std::filesystem::path& dir);

// A [data] path that is a directory `strata data prepare` wrote: [data] document_end and dtype
// default to its meta.json's (set in `data`), and so does [model] vocab_size (returned: a model's
// own derived defaults, such as its weights' config.json, come first; strategy/prepared_data.cpp).
// Declared here, not in strategy.h, which plugins built against an older SDK include.
STRATA_API std::vector<DerivesDefaults::Derived> apply_prepared_data(const Config& job, const ComponentRegistry& registry,
                                                                      RawSection& data, Diagnostics& diagnostics);

}  // namespace strata
