// Reading strategy TOML into raw sections, and applying command-line overrides.
#include <algorithm>
#include <fstream>
#include <sstream>

#include <toml++/toml.h>

#include "strata/core/strategy.h"
#include "strata/errors.h"

namespace strata {

namespace {

SourcePos pos_of(const toml::source_region& region, const std::string& file) {
  return SourcePos{file, static_cast<int>(region.begin.line), static_cast<int>(region.begin.column)};
}

// Returns false (and reports) for TOML values the strategy format has no use for.
bool to_value(const toml::node& node, Value& out, std::string& why) {
  if (auto v = node.as_boolean()) return out = v->get(), true;
  if (auto v = node.as_integer()) return out = static_cast<int64_t>(v->get()), true;
  if (auto v = node.as_floating_point()) return out = v->get(), true;
  if (auto v = node.as_string()) return out = v->get(), true;
  if (auto array = node.as_array()) {
    StringList list;
    for (const auto& element : *array) {
      auto s = element.as_string();
      if (!s) return why = "lists must hold strings only", false;
      list.push_back(s->get());
    }
    return out = std::move(list), true;
  }
  if (node.is_table()) return why = "nested tables are not part of the strategy format", false;
  return why = "dates and times are not part of the strategy format", false;
}

void read_section(const toml::table& table, RawSection& section, const std::string& file, Diagnostics& diagnostics) {
  section.pos = pos_of(table.source(), file);
  for (const auto& [key, node] : table) {
    Value value;
    std::string why;
    SourcePos pos = pos_of(key.source(), file);
    if (!to_value(node, value, why)) {
      diagnostics.error(pos, "key '" + std::string(key.str()) + "' in " + section.label + ": " + why);
      continue;
    }
    section.entries.push_back({std::string(key.str()), RawEntry{std::move(value), pos, Origin::File}});
  }
  // toml++ iterates keys alphabetically; messages and plans read better in file order.
  std::stable_sort(section.entries.begin(), section.entries.end(), [](const auto& a, const auto& b) {
    return std::pair(a.second.pos.line, a.second.pos.column) < std::pair(b.second.pos.line, b.second.pos.column);
  });
}

RawSection* section_named(RawStrategy& s, const std::string& name) {
  if (name == "job") return &s.job;
  if (name == "model") return &s.model;
  if (name == "data") return &s.data;
  if (name == "optimizer") return &s.optimizer;
  if (name == "parallel") return &s.parallel;
  return nullptr;
}

void init_sections(RawStrategy& s, const std::string& file) {
  for (const auto& name : strategy_sections()) {
    if (name == "pass") continue;
    RawSection* section = section_named(s, name);
    section->label = "[" + name + "]";
    section->pos = SourcePos{file, 0, 0};
  }
}

std::string pass_name(const RawSection& section) {
  const RawEntry* name = section.find("name");
  const auto* s = name ? std::get_if<std::string>(&name->value) : nullptr;
  return s ? *s : std::string();
}

Value parse_override_value(const std::string& text) {
  try {
    toml::table parsed = toml::parse("v = " + text);
    Value value;
    std::string why;
    if (const toml::node* node = parsed.get("v"); node && to_value(*node, value, why)) return value;
  } catch (const toml::parse_error&) {
  }
  return text;  // a bare word such as llama or /data/train.bin
}

}  // namespace

const RawEntry* RawSection::find(const std::string& key) const {
  for (const auto& [k, entry] : entries)
    if (k == key) return &entry;
  return nullptr;
}

void RawSection::set(const std::string& key, RawEntry entry) {
  for (auto& [k, existing] : entries)
    if (k == key) return void(existing = std::move(entry));
  entries.emplace_back(key, std::move(entry));
}

const std::vector<std::string>& strategy_sections() {
  static const std::vector<std::string> sections{"job", "model", "data", "optimizer", "parallel", "pass"};
  return sections;
}

RawStrategy parse_strategy_text(const std::string& text, const std::string& file, Diagnostics& diagnostics) {
  RawStrategy strategy;
  strategy.file = file;
  init_sections(strategy, file);
  toml::table root;
  try {
    root = toml::parse(text, file);
  } catch (const toml::parse_error& e) {
    diagnostics.error(pos_of(e.source(), file), "invalid TOML: " + std::string(e.description()));
    return strategy;
  }
  for (const auto& [key, node] : root) {
    const std::string name(key.str());
    SourcePos pos = pos_of(key.source(), file);
    if (name == "pass") {
      const toml::array* array = node.as_array();
      if (!array || !array->is_array_of_tables()) {
        diagnostics.error(pos, "'pass' must be written as [[pass]] tables");
        continue;
      }
      for (const auto& element : *array) {
        RawSection section;
        section.label = "[[pass]] #" + std::to_string(strategy.passes.size() + 1);
        read_section(*element.as_table(), section, file, diagnostics);
        if (std::string n = pass_name(section); !n.empty()) section.label = "[[pass]] '" + n + "'";
        strategy.passes.push_back(std::move(section));
      }
      continue;
    }
    RawSection* section = section_named(strategy, name);
    if (!section) {
      diagnostics.error(pos, "unknown " + std::string(node.is_table() ? "section [" + name + "]" : "top-level key '" + name + "'") +
                                 "; a strategy has [job], [model], [data], [optimizer], [parallel] and [[pass]]");
      continue;
    }
    if (!node.is_table()) {
      diagnostics.error(pos, "'" + name + "' must be a table: write [" + name + "]");
      continue;
    }
    read_section(*node.as_table(), *section, file, diagnostics);
  }
  return strategy;
}

RawStrategy load_strategy_file(const std::filesystem::path& file, Diagnostics& diagnostics) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) throw UserError("cannot read strategy file " + file.string());
  std::ifstream in(file, std::ios::binary);
  if (!in) throw UserError("cannot read strategy file " + file.string());
  std::stringstream text;
  text << in.rdbuf();
  return parse_strategy_text(text.str(), file.string(), diagnostics);
}

void apply_overrides(RawStrategy& strategy, const StringList& sets, const StringList& disables, Diagnostics& diagnostics) {
  for (const auto& set : sets) {
    SourcePos pos{"--set " + set, 0, 0};
    auto eq = set.find('=');
    std::string path = set.substr(0, eq);
    if (eq == std::string::npos || path.empty()) {
      diagnostics.error(pos, "expected section.key=value (for a pass: pass.NAME.key=value)");
      continue;
    }
    RawEntry entry{parse_override_value(set.substr(eq + 1)), pos, Origin::CommandLine};
    auto dot = path.find('.');
    std::string section_name = path.substr(0, dot);
    if (dot == std::string::npos || dot + 1 == path.size()) {
      diagnostics.error(pos, "expected section.key=value (for a pass: pass.NAME.key=value)");
    } else if (section_name == "pass") {
      std::string rest = path.substr(dot + 1);
      auto dot2 = rest.find('.');
      if (dot2 == std::string::npos || dot2 == 0 || dot2 + 1 == rest.size()) {
        diagnostics.error(pos, "expected pass.NAME.key=value");
        continue;
      }
      std::string name = rest.substr(0, dot2), key = rest.substr(dot2 + 1);
      bool found = false;
      for (auto& pass : strategy.passes)
        if (pass_name(pass) == name) found = true, pass.set(key, entry);
      if (!found) diagnostics.error(pos, "the strategy has no [[pass]] named '" + name + "'");
    } else if (RawSection* section = section_named(strategy, section_name)) {
      section->set(path.substr(dot + 1), entry);
    } else {
      diagnostics.error(pos, "unknown section '" + section_name + "'; use job, model, data, optimizer, parallel or pass.NAME");
    }
  }
  for (const auto& name : disables) {
    bool found = false;
    for (auto& pass : strategy.passes)
      if (pass_name(pass) == name) found = true, pass.set("enabled", RawEntry{false, {"--disable " + name, 0, 0}, Origin::CommandLine});
    if (!found) diagnostics.error({"--disable " + name, 0, 0}, "the strategy has no [[pass]] named '" + name + "'");
  }
}

std::vector<std::filesystem::path> strategy_plugin_path(const RawStrategy& strategy) {
  std::vector<std::filesystem::path> out;
  const RawEntry* entry = strategy.job.find("plugin_path");
  const auto* list = entry ? std::get_if<StringList>(&entry->value) : nullptr;
  if (!list) return out;  // a wrong type is reported when [job] is resolved
  const auto base = std::filesystem::path(strategy.file).parent_path();
  for (const auto& p : *list) {
    std::filesystem::path path(p);
    // Relative to the strategy file when it came from the file, to the cwd from --set.
    out.push_back(path.is_absolute() || entry->origin == Origin::CommandLine ? path : base / path);
  }
  return out;
}

}  // namespace strata
