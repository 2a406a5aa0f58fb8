// Moving weights between Strata models and Hugging Face checkpoints.
#pragma once

#include <filesystem>
#include <string>

#include "strata/nn.h"
#include "strata/optimizer.h"

namespace strata {

// A Hugging Face checkpoint: a .safetensors file, or a directory holding model.safetensors or
// model.safetensors.index.json with its shards. Malformed files are UserErrors.
STRATA_API NamedTensors read_hf_checkpoint(const std::filesystem::path& path);

// Copies `tensors` (Strata names) into the model's parameters. Every parameter must be given
// exactly once with its shape; anything missing, extra or mis-shaped is a UserError naming it
// and `source`.
STRATA_API void load_parameters(nn::Model& model, const NamedTensors& tensors, const std::string& source);

}  // namespace strata
