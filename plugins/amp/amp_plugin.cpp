// Automatic mixed precision: autocast to fp16/bf16 with fp32 master weights.
#include "strata/not_built.h"
#include "strata/plugin.h"

namespace strata::amp {
namespace {

class AmpPass final : public Pass {
 public:
  AmpPass()
      : Pass({ComponentKind::Pass, "amp", "Autocast to fp16 or bf16 with fp32 master weights and a dynamic loss scaler",
              Schema()
                  .string("dtype", "bf16", "Compute dtype", {"bf16", "fp16"})
                  .real("init_scale", 65536.0, "fp16: initial loss scale", at_least(1))
                  .real("growth_factor", 2.0, "fp16: scale multiplier after growth_interval clean steps", at_least(1))
                  .real("backoff_factor", 0.5, "fp16: scale multiplier after a non-finite step", between(0, 1))
                  .integer("growth_interval", 2000, "fp16: clean steps before the scale grows", at_least(1))
                  .boolean("skip_if_nonfinite", false, "bf16: skip steps whose gradients are not finite")
                  .string("reduce_dtype", "fp32", "Dtype gradients are reduced in under sharded passes", {"fp32", "bf16", "fp16"})},
             {Phase::Precision, {}, {"half"}, {}, {}}) {}

  void validate(const Config& config, const SourcePos& section, Diagnostics& diagnostics) const override {
    if (config.get_float("backoff_factor") <= 0 || config.get_float("backoff_factor") >= 1)
      diagnostics.error(section, "pass 'amp' backoff_factor must be strictly between 0 and 1");
  }

  void apply(Job&, const Config&) const override { fail_not_built("pass 'amp'"); }
};

void register_components(Registry& registry) { registry.add(std::make_unique<AmpPass>()); }

}  // namespace
}  // namespace strata::amp

STRATA_PLUGIN("amp", "0.1.0", strata::amp::register_components)
