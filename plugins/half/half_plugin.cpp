// The whole model and optimizer in half precision (ATorch's `half`): parameters, buffers,
// activations, gradients and optimizer state all in fp16 or bf16, with no master copy and no loss
// scaling. Half the memory of fp32 for every model state, at the price of precision.
#include <ATen/ATen.h>

#include "strata/plugin.h"

namespace strata::half {
namespace {

class HalfPass final : public Pass {
 public:
  HalfPass()
      : Pass({ComponentKind::Pass, "half", "Model and optimizer states in fp16 or bf16",
              Schema().string("dtype", "bf16", "Parameter and compute dtype", {"bf16", "fp16"})},
             {Phase::Precision, {}, {"amp"}, {}, {}}) {}

  std::optional<c10::ScalarType> compute_dtype(const Config& config) const override {
    return config.get_string("dtype") == "fp16" ? at::kHalf : at::kBFloat16;
  }

  // Before the wrapping passes, so ddp buckets and zero/fsdp units are built from half tensors.
  void apply(Job& job, const Config& config) const override {
    const at::ScalarType dtype = config.get_string("dtype") == "fp16" ? at::kHalf : at::kBFloat16;
    // Placeholders of a sharded build (nn::placeholder) change dtype without materialising.
    at::NoGradGuard no_grad;
    for (auto p : job.model->parameters())
      if (nn::is_placeholder(p)) p.set_data(nn::placeholder(p.sizes(), p.options().dtype(dtype)));
    job.model->to(dtype);
  }
};

void register_components(Registry& registry) { registry.add(std::make_unique<HalfPass>()); }

}  // namespace
}  // namespace strata::half

STRATA_PLUGIN("half", "0.1.0", strata::half::register_components)
