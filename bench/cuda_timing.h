// Timing and peak memory of one call on the GPU, for the CUDA benches: CUDA events around the
// call, and the caching allocator's peak during it above what was allocated before it. An
// out-of-memory error is caught and reported as ms = -1.
#pragma once

#include <algorithm>
#include <functional>
#include <vector>

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include "cpu_timing.h"  // median

namespace strata::bench {

struct CudaSample {
  double ms = -1;  // -1: out of memory
  double peak_mib = -1;
};

inline int64_t cuda_allocated(bool peak) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  const auto& bytes = stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
  return peak ? bytes.peak : bytes.current;
}

inline CudaSample time_on_gpu(const std::function<void()>& call) {
  CudaSample s;
  try {
    const int64_t before = cuda_allocated(false);
    c10::cuda::CUDACachingAllocator::resetPeakStats(0);
    at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);  // timing enabled
    start.record();
    call();
    stop.record();
    stop.synchronize();
    s.ms = start.elapsed_time(stop);
    s.peak_mib = static_cast<double>(cuda_allocated(true) - before) / (1 << 20);
  } catch (const c10::OutOfMemoryError&) {
    c10::cuda::CUDACachingAllocator::emptyCache();
  }
  return s;
}

}  // namespace strata::bench
