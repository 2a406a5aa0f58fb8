// [model] init_from against the checkpoint's config.json, at plan time.
//
// Weights alone do not say which model they belong to. A Llama of 8 heads of 16 and one of 4
// heads of 32 have the same tensors; rope_theta, rms_norm_eps and tie_word_embeddings have none;
// a checkpoint trained with rope_scaling or attention biases loads into a model that computes
// something else. transformers keeps that description in config.json beside the weights
// (save_pretrained, `strata ckpt export`). Where one lies in the init_from directory (or beside
// the file or index init_from names), each [model] key with a counterpart there must agree with
// it, and a feature these models do not compute must be off. A mismatch is an error naming the
// [model] key, both values and the value to write, found by `strata plan` before a rank starts.
// Without config.json the tensors' names and shapes are all that is checked, as before.
//
// The same checks fill the strategy in (strata/component.h: DerivesDefaults): built with a list
// to collect into, a check whose [model] key is left at its default takes config.json's value
// instead, so `init_from = "DIR"` alone describes the model as from_pretrained does. A key the
// strategy states is only checked. Errors found while collecting are the caller's to drop:
// validate reports them on the filled config.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/component.h"
#include "strata/config.h"

namespace strata::models {

// The config.json model_types the bundled model `model` ("gpt", "llama", "mixtral") loads: its
// LoadsHfModelTypes answer, and the model a refused model_type is pointed to.
const std::vector<std::string>& hf_model_types_of(const std::string& model);

class HfConfigCheck {
 public:
  using json = nlohmann::json;

  // Reads config.json beside [model] init_from; with none (or no init_from) every check passes.
  // With `derived`, the checks of keys at their defaults add config.json's values there instead.
  HfConfigCheck(const Config& config, const SourcePos& section, Diagnostics& diagnostics,
                std::vector<DerivesDefaults::Derived>* derived = nullptr);
  explicit operator bool() const { return config_json_.is_object(); }

  // A model's DerivesDefaults: the values `checks` (its validate's, on a collecting check) take from
  // config.json for the keys `config` leaves at their defaults.
  static std::vector<DerivesDefaults::Derived> derived(const Config& config, const std::function<void(HfConfigCheck&)>& checks);

  // config.json's model_type (where it has one) is one of `types`; `expected` names them for the
  // message, which names the bundled model that loads it where that is not `this_model`.
  void model_type(const std::vector<std::string>& types, const std::string& expected, const std::string& this_model);
  // [model] `key` equals config.json's `hf_key`. `absent` stands for a missing or null hf_key
  // (transformers' default); without it nothing is checked then.
  void same(const std::string& key, const std::string& hf_key, const std::optional<json>& absent = std::nullopt);
  // The same for a value that follows from [model] keys (`what` names it, reported at `key`);
  // `key_sets_it`: writing config.json's value into `key` would match (the line says so).
  void same_derived(const std::string& what, const json& value, const std::string& key, const std::string& hf_key,
                    const std::optional<json>& absent, bool key_sets_it = false);
  // config.json's `hf_key` is missing, null or `neutral`; anything else is `feature`, which these models do not compute.
  void off_unless(const std::string& hf_key, const json& neutral, const std::string& feature);
  // [model] `key` equals `hf` (config.json's `hf_label`; null: nothing to check).
  void compare(const std::string& key, const json& hf, const std::string& hf_label);
  // The rotary scaling config.json describes: transformers 5's rope_parameters.rope_type, or 4's
  // rope_scaling's rope_type (or type); "default" without one.
  std::string rope_type() const;
  // A parameter of that scaling ("factor", ...), from rope_parameters or rope_scaling; null when missing.
  json rope_parameter(const std::string& key) const;
  // Reports a feature these models do not compute (`what`: config.json's key and value, and what it means).
  void not_computed(const std::string& what);
  // [model] max_positions (0: seq_len) against config.json's `hf_key`, the context the weights are
  // made for. Left at its default it must equal config.json's (the line to write is named); stated,
  // it may differ (collecting, a longer context than seq_len is taken). A learned position table
  // (`learned_rows`) has no rows beyond config.json's: the model may take its first ones
  // (max_positions, or seq_len, less than it) and no more.
  void context(const std::string& hf_key, bool learned_rows);
  // [model] `key` (a boolean config.json has no key for, such as the architecture model_type
  // implies) defaults to `value`; only fills, never reports (model_type reports a mismatch).
  void implies(const std::string& key, bool value);
  // config.json's value of `hf_key` (rope_theta also under transformers 5's rope_parameters); null when missing.
  json value(const std::string& hf_key) const;

 private:
  SourcePos position(const std::string& key) const;
  std::string stated(const std::string& key) const;  // "[model] n_head = 8" (+ " (the default)")
  // While collecting: adds `hf` as `key`'s value where the key is at its default; whether it did.
  bool derive(const std::string& key, const json& hf);

  const Config& config_;
  const SourcePos& section_;
  Diagnostics& diagnostics_;
  std::vector<DerivesDefaults::Derived>* derived_;
  std::filesystem::path file_;
  json config_json_;
};

}  // namespace strata::models
