#include "common.h"

#include <algorithm>
#include <cmath>
#include <iostream>

#include "strata/core/plugin_loader.h"
#include "strata/core/schedules.h"

namespace strata::cli {

std::vector<std::filesystem::path> load_plugins(ComponentRegistry& registry,
                                                const std::vector<std::filesystem::path>& extra) {
  auto search_path = plugin_search_path(extra);
  PluginLoader(registry).load_search_path(search_path);
  pipeline::install_schedules(registry);  // passes find schedules by name from here on
  return search_path;
}

namespace {
std::string format_bound(double x) {
  std::string s = value_to_toml(Value{x});
  if (s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) s.resize(s.size() - 2);
  return s;
}
}  // namespace

std::string describe_type(const KeySpec& spec) {
  std::string out = spec.allow_auto ? "integer or \"auto\"" : value_type_name(spec.type);
  if (spec.min && spec.max) out += ", " + format_bound(*spec.min) + " to " + format_bound(*spec.max);
  else if (spec.min) out += " >= " + format_bound(*spec.min);
  else if (spec.max) out += " <= " + format_bound(*spec.max);
  if (!spec.choices.empty()) {
    out += ": ";
    for (size_t i = 0; i < spec.choices.size(); ++i) out += (i ? ", " : "") + spec.choices[i];
  }
  return out;
}

void insert_value(toml::table& table, const std::string& key, const Value& value) {
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, StringList>) {
          toml::array array;
          for (const auto& s : v) array.push_back(s);
          table.insert_or_assign(key, std::move(array));
        } else {
          table.insert_or_assign(key, v);
        }
      },
      value);
}

void print_json(const toml::table& table) { std::cout << toml::json_formatter{table} << "\n"; }

}  // namespace strata::cli
