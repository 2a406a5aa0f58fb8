#include "rope_frequencies.h"

#include <cmath>
#include <numbers>

#include "models.h"

namespace strata::models {
namespace {

// The llama3 scaling's keys with config.json's names for them.
const std::vector<std::pair<std::string, std::string>>& scaling_keys() {
  static const std::vector<std::pair<std::string, std::string>> keys = {{"rope_factor", "factor"},
                                                                        {"rope_low_freq_factor", "low_freq_factor"},
                                                                        {"rope_high_freq_factor", "high_freq_factor"},
                                                                        {"rope_original_context", "original_max_position_embeddings"}};
  return keys;
}

}  // namespace

RopeFrequencies RopeFrequencies::from(const Config& c) {
  RopeFrequencies r;
  r.theta = c.get_float("rope_theta");
  r.llama3 = c.get_string("rope_scaling") == "llama3";
  r.factor = c.get_float("rope_factor"), r.low_freq_factor = c.get_float("rope_low_freq_factor");
  r.high_freq_factor = c.get_float("rope_high_freq_factor"), r.original_context = c.get_int("rope_original_context");
  return r;
}

at::Tensor RopeFrequencies::inverse(int64_t head_dim, const at::TensorOptions& f32) const {
  const at::Tensor f = at::pow(theta, -at::arange(0, head_dim, 2, f32) / static_cast<double>(head_dim));
  if (!llama3) return f;
  // In fp32, in the order transformers' llama3 parameters are computed.
  const double context = static_cast<double>(original_context);
  const double slow_beyond = context / low_freq_factor, keep_below = context / high_freq_factor;  // wavelengths
  const at::Tensor wavelength = at::reciprocal(f) * (2 * std::numbers::pi);
  const at::Tensor slowed = at::where(wavelength > slow_beyond, f / factor, f);
  const at::Tensor s = (at::reciprocal(wavelength) * context - low_freq_factor) / (high_freq_factor - low_freq_factor);
  const at::Tensor between = (1 - s) * slowed / factor + s * slowed;
  const at::Tensor in_band = wavelength.ge(keep_below).logical_and(wavelength.le(slow_beyond));
  return at::where(in_band, between, slowed);
}

Schema& add_rope_keys(Schema& schema) {
  const RopeFrequencies d;  // the defaults
  return schema.real("rope_theta", d.theta, "RoPE base frequency", at_least(1))
      .string("rope_scaling", "none",
              "RoPE frequency scaling: \"llama3\" (Llama 3.1-3.3: a context rope_factor times the pre-training's) or none",
              {"none", "llama3"})
      .real("rope_factor", d.factor, "rope_scaling = \"llama3\": how many times the pre-training context (transformers' factor)", at_least(1))
      .real("rope_low_freq_factor", d.low_freq_factor, "rope_scaling = \"llama3\": wavelengths beyond rope_original_context / this are slowed by rope_factor",
            at_least(1e-9))
      .real("rope_high_freq_factor", d.high_freq_factor, "rope_scaling = \"llama3\": wavelengths below rope_original_context / this are kept", at_least(1e-9))
      .integer("rope_original_context", d.original_context, "rope_scaling = \"llama3\": the pre-training context (original_max_position_embeddings)",
               between(1, int64_t{1} << 40));
}

void validate_rope(const Config& c, const SourcePos& section, Diagnostics& diagnostics) {
  if (c.get_string("rope_scaling") == "none") {
    // A value other than the default (a saved strategy writes the defaults too).
    const RopeFrequencies defaults, given = RopeFrequencies::from(c);
    const double values[][2] = {{given.factor, defaults.factor},
                                {given.low_freq_factor, defaults.low_freq_factor},
                                {given.high_freq_factor, defaults.high_freq_factor},
                                {static_cast<double>(given.original_context), static_cast<double>(defaults.original_context)}};
    for (size_t i = 0; i < scaling_keys().size(); ++i)
      if (values[i][0] != values[i][1])
        diagnostics.error(c.entry(scaling_keys()[i].first).pos,
                          "[model] " + scaling_keys()[i].first + " applies to rope_scaling = \"llama3\" only, and rope_scaling is \"none\"");
    return;
  }
  if (c.get_float("rope_high_freq_factor") <= c.get_float("rope_low_freq_factor"))
    diagnostics.error(section, "[model] rope_high_freq_factor (" + value_to_toml(c.entry("rope_high_freq_factor").value) +
                                   ") must be greater than rope_low_freq_factor (" + value_to_toml(c.entry("rope_low_freq_factor").value) + ")");
}

std::string rope_config_json(const Config& c) {
  std::string out = "\"rope_theta\": " + json_number(c.get_float("rope_theta"));
  if (c.get_string("rope_scaling") != "llama3") return out;
  return out + ",\n  \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": " + json_number(c.get_float("rope_factor")) +
         ", \"low_freq_factor\": " + json_number(c.get_float("rope_low_freq_factor")) +
         ", \"high_freq_factor\": " + json_number(c.get_float("rope_high_freq_factor")) +
         ", \"original_max_position_embeddings\": " + std::to_string(c.get_int("rope_original_context")) + "}";
}

void check_rope(const Config& c, HfConfigCheck& hf, double default_theta) {
  hf.same("rope_theta", "rope_theta", default_theta);
  const std::string type = hf.rope_type();
  if (type != "default" && type != "llama3") return hf.not_computed("rope type " + type + " (rotary embeddings scaled another way than llama3)");
  hf.compare("rope_scaling", type == "llama3" ? "llama3" : "none", "rope type");
  if (type != "llama3" || c.get_string("rope_scaling") != "llama3") return;
  for (const auto& [key, hf_key] : scaling_keys()) hf.compare(key, hf.rope_parameter(hf_key), hf_key);
}

}  // namespace strata::models
