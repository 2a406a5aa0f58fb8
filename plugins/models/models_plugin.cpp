// Model factories: GPT-2 and Llama architectures, configured by [model].
#include "models.h"

namespace strata::models {

void check_heads(const Config& config, const SourcePos& section, Diagnostics& diagnostics) {
  if (config.get_int("d_model") % config.get_int("n_head") != 0)
    diagnostics.error(section, "[model] d_model (" + std::to_string(config.get_int("d_model")) +
                                   ") must be divisible by n_head (" + std::to_string(config.get_int("n_head")) + ")");
}

namespace {
void register_components(Registry& registry) {
  registry.add(make_gpt());
  registry.add(make_llama());
}
}  // namespace

}  // namespace strata::models

STRATA_PLUGIN("models", "0.2.0", strata::models::register_components)
