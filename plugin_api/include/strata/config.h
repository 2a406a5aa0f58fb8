// Config schemas (what keys a component accepts) and validated configs (what it was given).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "strata/export.h"

namespace strata {

// Where a value came from, for error messages and `strata plan`.
struct STRATA_API SourcePos {
  std::string file;  // a path, or "--set ..." for a command-line override
  int line = 0;      // 1-based; 0 when there is no line (defaults, command line)
  int column = 0;

  std::string str() const;  // "file:line:column", "file" when there is no line
};

enum class ValueType { Bool, Int, Float, String, StringList };
STRATA_API const char* value_type_name(ValueType type);

using StringList = std::vector<std::string>;
using Value = std::variant<bool, int64_t, double, std::string, StringList>;

STRATA_API std::string value_to_toml(const Value& value);

// The literal string a key with `allow_auto` accepts in place of its number.
inline constexpr const char* kAuto = "auto";

struct STRATA_API KeySpec {
  std::string key;
  ValueType type = ValueType::String;
  std::optional<Value> default_value;  // nullopt: the key is required
  std::string doc;
  std::optional<double> min;  // inclusive bounds for Int and Float
  std::optional<double> max;
  StringList choices;       // allowed values for String and each StringList element
  bool allow_auto = false;  // Int keys that also accept "auto"
  // The values `strata tune` tries for this key when the strategy leaves it unset; empty: tune
  // keeps the default. Only choices that never change the maths belong here (a schedule, a
  // bucket size, a micro-batch count), so every candidate trains the same model.
  std::vector<Value> tune_values;
};

// Inclusive numeric bounds for integer and real keys.
struct Range {
  std::optional<double> min;
  std::optional<double> max;
};
inline Range at_least(double min) { return Range{min, std::nullopt}; }
inline Range between(double min, double max) { return Range{min, max}; }

// A component's declared keys, in declaration order (that is the order docs and plans show).
class STRATA_API Schema {
 public:
  Schema& boolean(const std::string& key, bool default_value, const std::string& doc);
  Schema& integer(const std::string& key, int64_t default_value, const std::string& doc, Range range = {});
  Schema& integer_or_auto(const std::string& key, const std::string& doc, Range range = {});
  Schema& real(const std::string& key, double default_value, const std::string& doc, Range range = {});
  Schema& string(const std::string& key, const std::string& default_value, const std::string& doc,
                 StringList choices = {});
  Schema& strings(const std::string& key, StringList default_value, const std::string& doc,
                  StringList choices = {});
  Schema& required_string(const std::string& key, const std::string& doc, StringList choices = {});
  Schema& add(KeySpec spec);
  // Marks the key declared last as searched by `strata tune` over `values` (KeySpec::tune_values).
  Schema& tuned(std::vector<Value> values);

  const KeySpec* find(const std::string& key) const;
  const std::vector<KeySpec>& keys() const { return keys_; }

 private:
  std::vector<KeySpec> keys_;
};

enum class Origin { Default, File, CommandLine };
STRATA_API const char* origin_name(Origin origin);

// A config after validation: every declared key is present, with the right type.
class STRATA_API Config {
 public:
  struct Entry {
    Value value;
    Origin origin = Origin::Default;
    SourcePos pos;
  };

  void set(const std::string& key, Entry entry);
  bool has(const std::string& key) const;
  const Entry& entry(const std::string& key) const;  // throws std::out_of_range naming the key

  bool get_bool(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;  // Int values widen
  const std::string& get_string(const std::string& key) const;
  const StringList& get_strings(const std::string& key) const;
  bool is_auto(const std::string& key) const;

  const std::map<std::string, Entry>& entries() const { return entries_; }

 private:
  std::map<std::string, Entry> entries_;
};

// Collects every problem found instead of stopping at the first one.
class STRATA_API Diagnostics {
 public:
  struct Item {
    SourcePos pos;
    std::string message;
  };

  void error(const SourcePos& pos, const std::string& message);
  bool ok() const { return items_.empty(); }
  const std::vector<Item>& items() const { return items_; }
  // One line per problem: "file:line:col: error: message".
  std::string str() const;

 private:
  std::vector<Item> items_;
};

}  // namespace strata
