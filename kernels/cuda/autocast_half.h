// The 16-bit type CUDA autocast computes in, where it is on: what the *_autocast_out_cuda norms
// store their outputs in (layer_norm_cuda.h, rms_norm_cuda.h). nullopt where autocast is off or
// set to another type.
#pragma once

#include <optional>

#include <ATen/autocast_mode.h>

namespace strata::kernels {

inline std::optional<at::ScalarType> cuda_autocast_half_type() {
  if (!at::autocast::is_autocast_enabled(c10::DeviceType::CUDA)) return std::nullopt;
  const at::ScalarType type = at::autocast::get_autocast_dtype(c10::DeviceType::CUDA);
  if (type != at::kBFloat16 && type != at::kHalf) return std::nullopt;
  return type;
}

}  // namespace strata::kernels
