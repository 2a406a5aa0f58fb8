// libtorch's CUDA half, loaded at startup only where a CUDA driver is.
//
// The torch wheel is a CUDA build: libtorch_cuda.so holds ATen's CUDA kernels and, through its
// dependencies, cuBLAS, cuDNN and NCCL. TorchConfig links it into every binary, and its static
// initialisation (registering several thousand CUDA kernels with the dispatcher) then costs every
// process about 0.17 s of CPU and 360 MB of mappings: every `strata` command, every rank, every
// test, on machines that have no GPU and where it can never run (a CPU-only `strata --version`:
// 0.46 -> 0.28 s, 475 -> 120 MB resident). Strata's binaries therefore link libtorch_cpu only
// (cmake/StrataTorch.cmake) and this file loads libtorch_cuda.so, globally so that its kernels
// register as if linked, from a static initialiser of libstrata_core: every entry point (the
// launcher, the library API, the tests) links core, and core's initialisers run after
// libtorch_cpu's and before main, so nothing can touch CUDA before it is there.
//
// "Where a CUDA driver is" means libcuda.so.1 can be opened: without it at::hasCUDA() is false
// whether libtorch_cuda is loaded or not, so not loading it changes nothing a program can observe
// except the time. With a driver it is loaded exactly as before. A driver whose libtorch_cuda
// fails to load leaves the process CPU-only and says why (`strata --version`, and the error of a
// job that asks for a CUDA device).
#include "strata/core/cuda_runtime.h"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <string_view>

#include <ATen/Context.h>

namespace strata {

namespace {

// libtorch_cuda.so beside the libtorch_cpu.so this process uses: the wheel ships them together.
std::string torch_cuda_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&at::globalContext), &info) == 0 || info.dli_fname == nullptr) return "libtorch_cuda.so";
  return (std::filesystem::path(info.dli_fname).parent_path() / "libtorch_cuda.so").string();
}

CudaRuntime load() {
  const char* setting = std::getenv("STRATA_LOAD_TORCH_CUDA");
  const std::string_view choice = setting ? setting : "";
  if (choice == "0") return {false, "STRATA_LOAD_TORCH_CUDA=0"};
  if (choice != "1" && dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL) == nullptr) return {false, "no CUDA driver"};
  if (dlopen(torch_cuda_path().c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    const char* error = dlerror();
    return {false, error ? error : "libtorch_cuda.so could not be loaded"};
  }
  return {true, ""};
}

// Before main: see the top of this file.
[[maybe_unused]] const CudaRuntime& loaded_at_startup = load_cuda_runtime();

}  // namespace

const CudaRuntime& load_cuda_runtime() {
  static const CudaRuntime runtime = load();
  return runtime;
}

}  // namespace strata
