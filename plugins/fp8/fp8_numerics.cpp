#include "fp8_numerics.h"

#include <cmath>

namespace strata::fp8 {

double max_of(Format format) { return format == Format::E4M3 ? 448.0 : 57344.0; }

at::ScalarType dtype_of(Format format) { return format == Format::E4M3 ? at::kFloat8_e4m3fn : at::kFloat8_e5m2; }

at::Tensor quantize(const at::Tensor& x, const at::Tensor& scale, Format format) {
  const double max = max_of(format);
  // fp32 before scaling: a bf16 product would round once more before the fp8 cast.
  return (x.to(at::kFloat) * scale).clamp_(-max, max).to(dtype_of(format));
}

at::Tensor abs_max(const at::Tensor& x) {
  if (x.numel() == 0) return at::zeros({}, x.options().dtype(at::kFloat));
  return x.abs().max().to(at::kFloat);
}

at::Tensor scale_from_amax(const at::Tensor& amax, const at::Tensor& fp8_max, int64_t margin, const at::Tensor& previous) {
  const at::Tensor fresh = fp8_max / amax / std::ldexp(1.0, static_cast<int>(margin));
  const at::Tensor usable = amax.gt(0).logical_and_(at::isfinite(amax));
  return at::where(usable, fresh, previous);
}

DelayedScaling::DelayedScaling(int64_t count, int64_t history_len, at::Tensor fp8_max_, at::Device device) {
  const auto options = at::TensorOptions().dtype(at::kFloat).device(device);
  pending = at::zeros({count}, options);
  history = at::zeros({count, history_len}, options);
  scale = at::ones({count}, options);
  fp8_max = fp8_max_.to(options);
}

void DelayedScaling::observe(int64_t index, const at::Tensor& amax) {
  at::NoGradGuard no_grad;
  at::Tensor slot = pending.select(0, index);
  slot.copy_(at::maximum(slot, amax.to(slot.device())));
}

void DelayedScaling::roll() {
  at::NoGradGuard no_grad;
  const at::Tensor recorded = at::where(at::isfinite(pending), pending, at::zeros_like(pending));
  // Column 0 is the newest; the oldest column falls off the end.
  const int64_t len = history.size(1);
  at::Tensor older = history.narrow(1, 0, len - 1).clone();
  history.narrow(1, 1, len - 1).copy_(older);
  history.select(1, 0).copy_(recorded);
  pending.zero_();
}

void DelayedScaling::update_scales(bool use_max, int64_t margin) {
  at::NoGradGuard no_grad;
  const at::Tensor amaxes = use_max ? std::get<0>(history.max(1)) : history.select(1, 0);
  scale.copy_(scale_from_amax(amaxes, fp8_max, margin, scale));
  updated = true;
}

}  // namespace strata::fp8
