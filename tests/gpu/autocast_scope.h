// CUDA autocast to `type` for the scope's life, as amp's hooks turn it on and off around a
// forward (the cast cache cleared at the end), for the GPU tests.
#pragma once

#include <ATen/autocast_mode.h>

namespace strata::testing {

class CudaAutocast {
 public:
  explicit CudaAutocast(at::ScalarType type) {
    at::autocast::set_autocast_dtype(at::kCUDA, type);
    at::autocast::set_autocast_enabled(at::kCUDA, true);
  }
  ~CudaAutocast() {
    at::autocast::set_autocast_enabled(at::kCUDA, false);
    at::autocast::clear_cache();
  }
  CudaAutocast(const CudaAutocast&) = delete;
  CudaAutocast& operator=(const CudaAutocast&) = delete;
};

}  // namespace strata::testing
