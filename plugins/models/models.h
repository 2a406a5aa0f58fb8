// The model factories this plugin registers.
#pragma once

#include <memory>

#include "strata/plugin.h"

namespace strata::models {

std::unique_ptr<ModelFactory> make_gpt();
std::unique_ptr<ModelFactory> make_llama();

// d_model must split evenly into heads.
void check_heads(const Config& config, const SourcePos& section, Diagnostics& diagnostics);

}  // namespace strata::models
