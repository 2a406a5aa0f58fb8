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
# that calls it runs on one thread. So whatever uses torch is compiled and linked with OpenMP.
find_package(OpenMP REQUIRED COMPONENTS CXX)
set_property(TARGET torch APPEND PROPERTY INTERFACE_LINK_LIBRARIES OpenMP::OpenMP_CXX)
message(STATUS "Strata: libtorch ${STRATA_TORCH_WHEEL_VERSION} (CUDA ${STRATA_TORCH_CUDA_VERSION}) from ${STRATA_TORCH_CMAKE_PREFIX}")

# One precompiled header for every target that includes libtorch. Targets reuse it with
# strata_use_torch_pch(); they must then share compile flags and definitions with it.
add_library(strata_torch_pch OBJECT ${CMAKE_CURRENT_LIST_DIR}/../core/pch/torch_pch.cpp)
target_link_libraries(strata_torch_pch PUBLIC torch)
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
