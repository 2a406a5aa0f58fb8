// Whether libtorch's CUDA half (libtorch_cuda.so) was loaded into this process, and if not, why.
// Strata's binaries do not link it; libstrata_core loads it as the process starts, where a CUDA
// driver is (core/src/host/cuda_runtime.cpp).
#pragma once

#include <string>

#include "strata/export.h"

namespace strata {

struct CudaRuntime {
  bool loaded = false;
  std::string why;  // "no CUDA driver", "STRATA_LOAD_TORCH_CUDA=0", dlerror's text; empty when loaded
};

// Loads it once (later calls return the first answer). STRATA_LOAD_TORCH_CUDA=1 loads it even
// without a driver (tests of this path), =0 never.
STRATA_API const CudaRuntime& load_cuda_runtime();

}  // namespace strata
