// Helpers the subcommands share.
#pragma once

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include <toml++/toml.h>

#include "strata/config.h"
#include "strata/core/component_registry.h"
#include "strata/core/statistics.h"  // median and seconds_since, for the commands that measure

namespace strata::cli {

// Loads every plugin on the search path (STRATA_PLUGIN_PATH, then `extra`, then the installed
// directory) and returns the entries searched.
std::vector<std::filesystem::path> load_plugins(ComponentRegistry& registry,
                                                const std::vector<std::filesystem::path>& extra = {});

// "integer >= 1", "string: one of a, b", ... for help and docs.
std::string describe_type(const KeySpec& spec);

void insert_value(toml::table& table, const std::string& key, const Value& value);
void print_json(const toml::table& table);


}  // namespace strata::cli
