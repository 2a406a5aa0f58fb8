#include "hf_config_check.h"

#include <algorithm>
#include <cmath>
#include <fstream>

namespace strata::models {
namespace {

namespace fs = std::filesystem;
using json = HfConfigCheck::json;

// config.json in the init_from directory, or beside the file (or sharded index) it names.
fs::path config_json_of(const std::string& init_from) {
  std::error_code unreadable;
  const fs::path path(init_from);
  const fs::path file = fs::is_directory(path, unreadable) ? path / "config.json" : path.parent_path() / "config.json";
  return fs::is_regular_file(file, unreadable) ? file : fs::path();
}

json to_json(const Value& value) {
  if (const auto* b = std::get_if<bool>(&value)) return *b;
  if (const auto* i = std::get_if<int64_t>(&value)) return *i;
  if (const auto* d = std::get_if<double>(&value)) return *d;
  if (const auto* s = std::get_if<std::string>(&value)) return *s;
  return nullptr;
}

// Numbers compare by value (1e-05 in JSON is 1e-5 in TOML; an integral float is the integer).
bool equal(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) {
    const double x = a.get<double>(), y = b.get<double>();
    return x == y || std::abs(x - y) <= 1e-12 * std::max(std::abs(x), std::abs(y));
  }
  return a == b;
}

// config.json's value as the [model] key's type would be written in TOML.
std::string as_toml(const json& hf, const Value& like) {
  if (std::holds_alternative<int64_t>(like) && hf.is_number() && std::floor(hf.get<double>()) == hf.get<double>())
    return value_to_toml(Value{static_cast<int64_t>(hf.get<double>())});
  if (std::holds_alternative<double>(like) && hf.is_number()) {  // as config.json writes it (500000.0, not 5e+05)
    const std::string text = hf.dump();
    return text.find_first_of(".eE") == std::string::npos ? text + ".0" : text;
  }
  if (hf.is_boolean()) return value_to_toml(Value{hf.get<bool>()});
  if (hf.is_string()) return value_to_toml(Value{hf.get<std::string>()});
  return hf.dump();
}

// The bundled model that loads a config.json's model_type; empty for none.
std::string bundled_model_for(const std::string& model_type) {
  for (const char* model : {"gpt", "llama", "mixtral"}) {
    const std::vector<std::string>& types = hf_model_types_of(model);
    if (std::find(types.begin(), types.end(), model_type) != types.end()) return model;
  }
  return {};
}

// config.json's value as a value of the [model] key's type; nullopt when it is not one.
std::optional<Value> as_value(const json& hf, const Value& like) {
  if (std::holds_alternative<int64_t>(like) && hf.is_number() && std::floor(hf.get<double>()) == hf.get<double>())
    return Value{static_cast<int64_t>(hf.get<double>())};
  if (std::holds_alternative<double>(like) && hf.is_number()) return Value{hf.get<double>()};
  if (std::holds_alternative<bool>(like) && hf.is_boolean()) return Value{hf.get<bool>()};
  if (std::holds_alternative<std::string>(like) && hf.is_string()) return Value{hf.get<std::string>()};
  return std::nullopt;
}

// What to write to load config.json's `hf` into a [model] key like `like`; for a value of another
// type (a hand-edited config.json: "2" for 2), that config.json is what needs the fix.
std::string to_load(const std::string& key, const json& hf, const Value& like) {
  if (as_value(hf, like)) return "; set [model] " + key + " = " + as_toml(hf, like) + " to load them";
  const char* type = std::holds_alternative<int64_t>(like) ? "an integer" : std::holds_alternative<double>(like) ? "a number"
                     : std::holds_alternative<bool>(like)  ? "true or false" : "a string";
  return std::string("; that is not ") + type + ", as [model] " + key + " is: correct config.json";
}

}  // namespace

const std::vector<std::string>& hf_model_types_of(const std::string& model) {
  static const std::vector<std::string> gpt{"gpt2"}, llama{"llama", "mistral", "qwen2"}, mixtral{"mixtral"}, none;
  return model == "gpt" ? gpt : model == "llama" ? llama : model == "mixtral" ? mixtral : none;
}

HfConfigCheck::HfConfigCheck(const Config& config, const SourcePos& section, Diagnostics& diagnostics,
                             std::vector<DerivesDefaults::Derived>* derived)
    : config_(config), section_(section), diagnostics_(diagnostics), derived_(derived) {
  if (!config.has("init_from") || config.get_string("init_from").empty()) return;
  file_ = config_json_of(config.get_string("init_from"));
  if (file_.empty()) return;
  std::ifstream in(file_);
  config_json_ = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!config_json_.is_object())
    diagnostics_.error(position("init_from"), "[model] init_from: " + file_.string() + " is not a JSON object (transformers' config.json)");
}

std::vector<DerivesDefaults::Derived> HfConfigCheck::derived(const Config& config, const std::function<void(HfConfigCheck&)>& checks) {
  std::vector<DerivesDefaults::Derived> out;
  const SourcePos section;
  Diagnostics dropped;  // validate reports them, on the filled config
  HfConfigCheck hf(config, section, dropped, &out);
  if (hf) checks(hf);
  return out;
}

json HfConfigCheck::value(const std::string& hf_key) const {
  if (!*this) return nullptr;
  if (const auto it = config_json_.find(hf_key); it != config_json_.end()) return *it;
  // transformers 5 keeps the rotary settings in rope_parameters.
  if (const auto rope = config_json_.find("rope_parameters"); rope != config_json_.end() && rope->is_object())
    if (const auto it = rope->find(hf_key); it != rope->end()) return *it;
  return nullptr;
}

SourcePos HfConfigCheck::position(const std::string& key) const {
  if (config_.has(key) && config_.entry(key).origin != Origin::Default) return config_.entry(key).pos;
  return section_;
}

std::string HfConfigCheck::stated(const std::string& key) const {
  return "[model] " + key + " = " + value_to_toml(config_.entry(key).value) +
         (config_.entry(key).origin == Origin::Default ? " (the default)" : "");
}

bool HfConfigCheck::derive(const std::string& key, const json& hf) {
  if (!derived_ || !config_.has(key) || config_.entry(key).origin != Origin::Default) return false;
  std::optional<Value> value = as_value(hf, config_.entry(key).value);
  if (!value) return false;  // not the key's type: validate names both
  derived_->push_back({key, std::move(*value), SourcePos{file_.string(), 0, 0}});
  return true;
}

void HfConfigCheck::implies(const std::string& key, bool value) {
  if (*this && config_.get_bool(key) != value) derive(key, value);
}

void HfConfigCheck::model_type(const std::vector<std::string>& types, const std::string& expected, const std::string& this_model) {
  const json type = value("model_type");
  if (!type.is_string() || std::find(types.begin(), types.end(), type.get<std::string>()) != types.end()) return;
  const std::string model = bundled_model_for(type.get<std::string>());
  diagnostics_.error(position("init_from"), "[model] init_from: " + file_.string() + " describes a " + type.get<std::string>() +
                                                " model, but this [model] loads " + expected + " weights" +
                                                (model.empty() || model == this_model ? "" : "; [job] model = \"" + model + "\" loads it"));
}

void HfConfigCheck::same(const std::string& key, const std::string& hf_key, const std::optional<json>& absent) {
  const json hf = value(hf_key);
  compare(key, hf.is_null() && absent ? *absent : hf, hf_key);
}

void HfConfigCheck::compare(const std::string& key, const json& hf, const std::string& hf_label) {
  if (hf.is_null()) return;
  const Value& mine = config_.entry(key).value;
  if (equal(to_json(mine), hf) || derive(key, hf)) return;
  diagnostics_.error(position(key), stated(key) + ", but the weights' " + file_.string() + " has " + hf_label + " = " + hf.dump() +
                                        to_load(key, hf, mine));
}

void HfConfigCheck::context(const std::string& hf_key, bool learned_rows) {
  const json hf = value(hf_key);
  if (!hf.is_number_integer()) return;
  const int64_t theirs = hf.get<int64_t>(), seq_len = config_.get_int("seq_len"), given = config_.get_int("max_positions");
  const std::string has = "the weights' " + file_.string() + " has " + hf_key + " = " + std::to_string(theirs);
  if (learned_rows && std::max(seq_len, given) > theirs) {
    const std::string key = given > seq_len ? "max_positions" : "seq_len";
    diagnostics_.error(position(key), stated(key) + ", but " + has + ": their learned position table has no rows beyond; set [model] " + key +
                                          " <= " + std::to_string(theirs));
  } else if (given == 0 && theirs != seq_len && !(theirs > seq_len && derive("max_positions", theirs))) {
    diagnostics_.error(position("max_positions"),
                       "[model] max_positions = 0 (the default: seq_len, " + std::to_string(seq_len) + "), but " + has +
                           "; set [model] max_positions = " + std::to_string(theirs) + " to load them" +
                           (learned_rows ? " (or = " + std::to_string(seq_len) + " to keep their first " + std::to_string(seq_len) + " positions)"
                                         : " (or = " + std::to_string(seq_len) + " for an export that states this run's context)"));
  }
}

void HfConfigCheck::same_derived(const std::string& what, const json& value_here, const std::string& key, const std::string& hf_key,
                                 const std::optional<json>& absent, bool key_sets_it) {
  const json given = value(hf_key);
  const json hf = given.is_null() && absent ? *absent : given;
  if (hf.is_null() || equal(value_here, hf) || (key_sets_it && derive(key, hf))) return;
  diagnostics_.error(position(key), what + " is " + value_here.dump() + ", but the weights' " + file_.string() + " has " + hf_key +
                                        " = " + hf.dump() + " (" + stated(key) + ")" +
                                        (key_sets_it ? to_load(key, hf, config_.entry(key).value) : ""));
}

void HfConfigCheck::off_unless(const std::string& hf_key, const json& neutral, const std::string& feature) {
  const json hf = value(hf_key);
  if (hf.is_null() || equal(hf, neutral)) return;
  not_computed(hf_key + " = " + hf.dump() + " (" + feature + ")");
}

std::string HfConfigCheck::rope_type() const {
  if (const json type = value("rope_type"); type.is_string()) return type.get<std::string>();
  const json scaling = value("rope_scaling");
  if (!scaling.is_object()) return scaling.is_null() ? "default" : scaling.dump();
  const json type = scaling.contains("rope_type") ? scaling["rope_type"] : scaling.value("type", json("default"));
  return type.is_string() ? type.get<std::string>() : type.dump();
}

json HfConfigCheck::rope_parameter(const std::string& key) const {
  if (const json scaling = value("rope_scaling"); scaling.is_object() && scaling.contains(key)) return scaling[key];
  return value(key);  // rope_parameters' (transformers 5)
}

void HfConfigCheck::not_computed(const std::string& what) {
  diagnostics_.error(position("init_from"), "[model] init_from: " + file_.string() + " has " + what + ", which this model does not compute");
}

}  // namespace strata::models
