// The storage type the CUDA launchers take (cuda::Storage, activation_kernels.h) of an ATen dtype,
// for their C++ callers. Callers pass float, bfloat16 or half; anything else reads as float.
#pragma once

#include <c10/core/ScalarType.h>

#include "cuda/activation_kernels.h"

namespace strata::kernels {

inline cuda::Storage storage_of(c10::ScalarType type) {
  return type == c10::ScalarType::BFloat16 ? cuda::Storage::BFloat16
         : type == c10::ScalarType::Half   ? cuda::Storage::Half
                                           : cuda::Storage::Float;
}

}  // namespace strata::kernels
