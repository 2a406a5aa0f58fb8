# libtorch comes from the torch wheel in the virtual environment that scripts/setup made.
# STRATA_PYTHON names that interpreter; torch.utils.cmake_prefix_path tells where TorchConfig is.
set(STRATA_PYTHON "$ENV{HOME}/.local/share/strata/venv/bin/python" CACHE FILEPATH
    "Python interpreter whose torch wheel provides libtorch")
if(NOT EXISTS "${STRATA_PYTHON}")
  message(FATAL_ERROR "Strata: no Python at ${STRATA_PYTHON}; run scripts/setup first "
                      "or pass -DSTRATA_PYTHON=/path/to/python with torch==2.11.0 installed")
endif()
execute_process(
  COMMAND "${STRATA_PYTHON}" -c
          "import torch,sys;sys.stdout.write(';'.join([torch.utils.cmake_prefix_path, torch.__version__, str(torch.version.cuda)]))"
  OUTPUT_VARIABLE _strata_torch_info RESULT_VARIABLE _strata_rc ERROR_QUIET)
if(NOT _strata_rc EQUAL 0)
  message(FATAL_ERROR "Strata: ${STRATA_PYTHON} cannot import torch; run scripts/setup")
endif()
list(GET _strata_torch_info 0 STRATA_TORCH_CMAKE_PREFIX)
list(GET _strata_torch_info 1 STRATA_TORCH_WHEEL_VERSION)
list(GET _strata_torch_info 2 STRATA_TORCH_CUDA_VERSION)
list(PREPEND CMAKE_PREFIX_PATH "${STRATA_TORCH_CMAKE_PREFIX}")
# TorchConfig looks for the CUDA toolkit because the wheel is a CUDA build.
if(EXISTS /usr/local/cuda/bin/nvcc AND NOT CMAKE_CUDA_COMPILER)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
endif()
# Naming the architectures also stops TorchConfig from probing for a GPU at configure time.
set(TORCH_CUDA_ARCH_LIST "9.0" CACHE STRING "GPU architectures CUDA code is built for (H100/H200: 9.0)")
find_package(Torch REQUIRED)
# libtorch's at::parallel_for is a header template that runs in parallel only where the including
# file is compiled with OpenMP (_OPENMP, as the wheel was built); without it every kernel of ours
# that calls it runs on one thread. So whatever uses torch is compiled and linked with OpenMP
# (strata_torch below links it).
find_package(OpenMP REQUIRED COMPONENTS CXX)

# What Strata's own targets link: strata_torch, libtorch's compile settings and libtorch_cpu. Its
# CUDA half (libtorch_cuda.so) is loaded at run time, and only where a CUDA driver is
# (core/src/host/cuda_runtime.cpp says why). TorchConfig's `torch` forces libtorch_cuda.so into
# every binary that links it (--no-as-needed), and libtorch.so, a stub that names libtorch_cpu and
# libtorch_cuda, would pull it in as well. So strata_torch takes `torch`'s compile settings without
# linking libtorch.so, and torch_cuda_library keeps its compile settings (USE_C10D_NCCL, the CUDA
# headers) but links only what a binary uses (c10_cuda and cudart where CUDA kernels are built).
# Shared libraries link with -z defs: code that starts to call into libtorch_cuda then fails to
# link here instead of failing to load on a GPU machine. Installed, the SDK's targets link `torch`
# as before (out-of-tree plugins may load libtorch_cuda themselves).
set_property(TARGET torch_cuda_library PROPERTY INTERFACE_LINK_LIBRARIES "$<TARGET_PROPERTY:torch_cuda,INTERFACE_LINK_LIBRARIES>")
add_library(strata_torch INTERFACE IMPORTED GLOBAL)  # imported: its headers are system headers, as `torch`'s are
foreach(property INCLUDE_DIRECTORIES COMPILE_DEFINITIONS COMPILE_OPTIONS)
  set_property(TARGET strata_torch PROPERTY INTERFACE_${property} "$<TARGET_PROPERTY:torch,INTERFACE_${property}>")
endforeach()
target_link_libraries(strata_torch INTERFACE torch_cpu_library torch_cuda_library OpenMP::OpenMP_CXX)
foreach(kind EXE SHARED MODULE)
  string(APPEND CMAKE_${kind}_LINKER_FLAGS " -Wl,--as-needed")
endforeach()
string(APPEND CMAKE_SHARED_LINKER_FLAGS " -Wl,-z,defs")
string(APPEND CMAKE_MODULE_LINKER_FLAGS " -Wl,-z,defs")
message(STATUS "Strata: libtorch ${STRATA_TORCH_WHEEL_VERSION} (CUDA ${STRATA_TORCH_CUDA_VERSION}) from ${STRATA_TORCH_CMAKE_PREFIX}")

# One precompiled header for every target that includes libtorch. Targets reuse it with
# strata_use_torch_pch(); they must then share compile flags and definitions with it.
add_library(strata_torch_pch OBJECT ${CMAKE_CURRENT_LIST_DIR}/../core/pch/torch_pch.cpp)
target_link_libraries(strata_torch_pch PUBLIC strata_torch)
target_precompile_headers(strata_torch_pch PRIVATE ${CMAKE_CURRENT_LIST_DIR}/../core/pch/torch_pch.h)

function(strata_use_torch_pch target)
  target_precompile_headers(${target} REUSE_FROM strata_torch_pch)
  # The header was compiled as position-independent library code; an executable must match
  # (-fPIC code is valid in a PIE) or GCC ignores the precompiled header.
  get_target_property(type ${target} TYPE)
  if(type STREQUAL "EXECUTABLE")
    target_compile_options(${target} PRIVATE -fPIC)
  endif()
endfunction()
