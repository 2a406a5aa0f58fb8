// The whole model and optimizer in half precision (ATorch's `half`).
#include "strata/not_built.h"
#include "strata/plugin.h"

namespace strata::half {
namespace {

class HalfPass final : public Pass {
 public:
  HalfPass()
      : Pass({ComponentKind::Pass, "half", "Model and optimizer states in fp16 or bf16",
              Schema().string("dtype", "bf16", "Parameter and compute dtype", {"bf16", "fp16"})},
             {Phase::Precision, {}, {"amp"}, {}, {}}) {}

  void apply(Job&, const Config&) const override { fail_not_built("pass 'half'"); }
};

void register_components(Registry& registry) { registry.add(std::make_unique<HalfPass>()); }

}  // namespace
}  // namespace strata::half

STRATA_PLUGIN("half", "0.1.0", strata::half::register_components)
