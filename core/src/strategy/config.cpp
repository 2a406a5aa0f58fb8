#include "strata/config.h"

#include <charconv>
#include <cmath>
#include <stdexcept>

namespace strata {

std::string SourcePos::str() const {
  if (line <= 0) return file;
  return file + ":" + std::to_string(line) + ":" + std::to_string(column);
}

const char* value_type_name(ValueType type) {
  switch (type) {
    case ValueType::Bool: return "boolean";
    case ValueType::Int: return "integer";
    case ValueType::Float: return "number";
    case ValueType::String: return "string";
    case ValueType::StringList: return "list of strings";
  }
  return "?";
}

namespace {

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string format_double(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  // Shortest text that reads back as the same double.
  auto result = std::to_chars(buf, buf + sizeof buf, d);
  std::string s(buf, result.ptr);
  // TOML needs a fractional part or exponent to read the value back as a float.
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

}  // namespace

std::string value_to_toml(const Value& value) {
  struct Visitor {
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const { return format_double(d); }
    std::string operator()(const std::string& s) const { return quote(s); }
    std::string operator()(const StringList& list) const {
      std::string out = "[";
      for (size_t i = 0; i < list.size(); ++i) out += (i ? ", " : "") + quote(list[i]);
      return out + "]";
    }
  };
  return std::visit(Visitor{}, value);
}

Schema& Schema::add(KeySpec spec) {
  if (find(spec.key)) throw std::logic_error("schema declares key '" + spec.key + "' twice");
  keys_.push_back(std::move(spec));
  return *this;
}

Schema& Schema::tuned(std::vector<Value> values) {
  if (keys_.empty()) throw std::logic_error("Schema::tuned() before any key");
  keys_.back().tune_values = std::move(values);
  return *this;
}

Schema& Schema::boolean(const std::string& key, bool default_value, const std::string& doc) {
  return add({key, ValueType::Bool, Value{default_value}, doc});
}

Schema& Schema::integer(const std::string& key, int64_t default_value, const std::string& doc, Range range) {
  return add({key, ValueType::Int, Value{default_value}, doc, range.min, range.max});
}

Schema& Schema::integer_or_auto(const std::string& key, const std::string& doc, Range range) {
  KeySpec spec{key, ValueType::Int, Value{std::string(kAuto)}, doc, range.min, range.max};
  spec.allow_auto = true;
  return add(std::move(spec));
}

Schema& Schema::real(const std::string& key, double default_value, const std::string& doc, Range range) {
  return add({key, ValueType::Float, Value{default_value}, doc, range.min, range.max});
}

Schema& Schema::string(const std::string& key, const std::string& default_value, const std::string& doc,
                       StringList choices) {
  return add({key, ValueType::String, Value{default_value}, doc, std::nullopt, std::nullopt, std::move(choices)});
}

Schema& Schema::strings(const std::string& key, StringList default_value, const std::string& doc,
                        StringList choices) {
  return add({key, ValueType::StringList, Value{std::move(default_value)}, doc, std::nullopt, std::nullopt,
              std::move(choices)});
}

Schema& Schema::required_string(const std::string& key, const std::string& doc, StringList choices) {
  return add({key, ValueType::String, std::nullopt, doc, std::nullopt, std::nullopt, std::move(choices)});
}

const KeySpec* Schema::find(const std::string& key) const {
  for (const auto& spec : keys_)
    if (spec.key == key) return &spec;
  return nullptr;
}

const char* origin_name(Origin origin) {
  switch (origin) {
    case Origin::Default: return "default";
    case Origin::File: return "file";
    case Origin::CommandLine: return "command line";
  }
  return "?";
}

void Config::set(const std::string& key, Entry entry) { entries_[key] = std::move(entry); }

bool Config::has(const std::string& key) const { return entries_.count(key) != 0; }

const Config::Entry& Config::entry(const std::string& key) const {
  auto it = entries_.find(key);
  if (it == entries_.end()) throw std::out_of_range("config has no key '" + key + "'");
  return it->second;
}

namespace {

template <class T>
const T& get_as(const Config& config, const std::string& key, const char* wanted) {
  const Value& value = config.entry(key).value;
  if (const T* v = std::get_if<T>(&value)) return *v;
  throw std::logic_error("config key '" + key + "' is not a " + wanted);
}

}  // namespace

bool Config::get_bool(const std::string& key) const { return get_as<bool>(*this, key, "boolean"); }
int64_t Config::get_int(const std::string& key) const { return get_as<int64_t>(*this, key, "integer"); }
const std::string& Config::get_string(const std::string& key) const {
  return get_as<std::string>(*this, key, "string");
}
const StringList& Config::get_strings(const std::string& key) const {
  return get_as<StringList>(*this, key, "list of strings");
}

double Config::get_float(const std::string& key) const {
  const Value& value = entry(key).value;
  if (const auto* i = std::get_if<int64_t>(&value)) return static_cast<double>(*i);
  return get_as<double>(*this, key, "number");
}

bool Config::is_auto(const std::string& key) const {
  const auto* s = std::get_if<std::string>(&entry(key).value);
  return s && *s == kAuto;
}

void Diagnostics::error(const SourcePos& pos, const std::string& message) { items_.push_back({pos, message}); }

std::string Diagnostics::str() const {
  std::string out;
  for (const auto& item : items_) {
    out += item.pos.file.empty() ? "" : item.pos.str() + ": ";
    out += "error: " + item.message + "\n";
  }
  return out;
}

}  // namespace strata
