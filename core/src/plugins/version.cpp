#include "strata/core/version.h"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include "strata/abi.h"
#include "strata/core/build_info.h"
#include "strata/core/cuda_runtime.h"

namespace strata {

VersionInfo version_info() {
  VersionInfo info;
  info.strata = STRATA_VERSION_STRING;
  info.abi = std::to_string(STRATA_ABI_VERSION_MAJOR) + "." + std::to_string(STRATA_ABI_VERSION_MINOR);
  info.torch = STRATA_TORCH_VERSION_STRING;
  info.torch_wheel = STRATA_TORCH_WHEEL_VERSION;
  info.torch_cuda = STRATA_TORCH_CUDA_VERSION;
  info.cxx_abi = STRATA_CXX_ABI_TAG;
  info.cuda_available = at::hasCUDA();
  info.cuda_runtime_absent = load_cuda_runtime().why;
  info.cuda_devices = info.cuda_available ? static_cast<int>(at::detail::getCUDAHooks().getNumGPUs()) : 0;
  return info;
}

}  // namespace strata
