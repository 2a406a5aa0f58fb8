// `strata report` of a `strata tune` output directory: what the cost model predicted against what
// the trials measured, for every candidate measured.
#pragma once

#include <filesystem>
#include <string>

namespace strata::cli {

// Whether `dir` holds a tune's tune.jsonl.
bool is_tune_dir(const std::filesystem::path& dir);

// The HTML section for the tune in `dir`; `summary` gets one line for the terminal.
std::string tune_section(const std::filesystem::path& dir, std::string& summary);

}  // namespace strata::cli
