// Rotary position embedding's frequencies for the Llama family, and Llama 3.1's "llama3" scaling.
//
// RoPE turns each pair i of a head's d dimensions by position x f_i, f_i = theta^(-2i/d). Llama
// 3.1 serves a context `factor` times longer than its pre-training's (`original_context` tokens)
// by slowing the pairs that turned less than about once in it: with the wavelength w_i = 2 pi / f_i,
// pairs with w_i < original_context / high_freq_factor keep f_i, pairs with w_i > original_context /
// low_freq_factor get f_i / factor, and the band between interpolates with s = (original_context /
// w_i - low_freq_factor) / (high_freq_factor - low_freq_factor): (1 - s) f_i / factor + s f_i
// (Meta's Llama 3.1 reference; transformers' rope_type "llama3", which Llama 3.1-3.3 checkpoints
// carry in config.json). Only the frequencies change; the rotation (ops::rope) is the same.
#pragma once

#include <string>

#include <ATen/ATen.h>

#include "hf_config_check.h"
#include "strata/config.h"

namespace strata::models {

struct RopeFrequencies {
  double theta = 10000;
  bool llama3 = false;  // [model] rope_scaling = "llama3"
  double factor = 8, low_freq_factor = 1, high_freq_factor = 4;
  int64_t original_context = 8192;

  static RopeFrequencies from(const Config& config);
  // f_i for the head's head_dim / 2 pairs, fp32.
  at::Tensor inverse(int64_t head_dim, const at::TensorOptions& f32) const;
};

// [model] rope_theta, rope_scaling and the llama3 scaling's keys.
Schema& add_rope_keys(Schema& schema);
// The scaling's keys are refused where rope_scaling = "none"; high_freq_factor > low_freq_factor.
void validate_rope(const Config& config, const SourcePos& section, Diagnostics& diagnostics);
// config.json's "rope_theta" entry and, with the llama3 scaling, its "rope_scaling" object.
std::string rope_config_json(const Config& config);
// [model]'s RoPE against init_from's config.json; `default_theta` stands for a missing rope_theta.
void check_rope(const Config& config, HfConfigCheck& hf, double default_theta);

}  // namespace strata::models
