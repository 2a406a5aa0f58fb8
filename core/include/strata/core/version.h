// What this strata was built with and what it finds at run time.
#pragma once

#include <string>

#include "strata/export.h"

namespace strata {

struct VersionInfo {
  std::string strata;         // project version
  std::string abi;            // the plugin ABI, "MAJOR.MINOR"
  std::string torch;          // libtorch headers it was compiled against
  std::string torch_wheel;    // torch.__version__ of the wheel that provided libtorch
  std::string torch_cuda;     // CUDA version of that wheel ("None" for a CPU wheel)
  std::string cxx_abi;        // STRATA_CXX_ABI_TAG
  bool cuda_available = false;
  int cuda_devices = 0;
  std::string cuda_runtime_absent;  // why libtorch_cuda was not loaded (strata/core/cuda_runtime.h); empty if it was
};

STRATA_API VersionInfo version_info();

}  // namespace strata
