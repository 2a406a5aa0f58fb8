// Measured CPU memory: an allocator in front of ATen's CPU allocator that counts the bytes of live
// tensors, with a resettable peak. A training run on the CPU reports its peak as
// `mem_device_peak_bytes` (what CUDA's caching allocator reports on a GPU), and the benches put
// the bytes an implementation actually allocated next to the formula. Unlike the resident set it
// does not see what malloc keeps after a free ([job] host_memory = "keep" keeps it all), so two
// layouts' tensors compare exactly. Only tensor storage is counted (not BLAS or OpenMP scratch
// that bypasses ATen's allocator), and only what is allocated after install().
#pragma once

#include <atomic>
#include <cstdint>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include "strata/export.h"

namespace strata {

class STRATA_API CountingCpuAllocator final : public c10::Allocator {
 public:
  // Installs one counting allocator in front of the current CPU allocator (once, process-wide;
  // thread-safe) and returns it.
  static CountingCpuAllocator& install();

  int64_t current() const { return current_.load(); }
  int64_t peak() const { return peak_.load(); }
  void reset_peak() { peak_.store(current_.load()); }

  c10::DataPtr allocate(size_t bytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

 private:
  explicit CountingCpuAllocator(c10::Allocator* base) : base_(base) {}
  static void release(void* context);
  void add(int64_t bytes);

  c10::Allocator* base_;
  std::atomic<int64_t> current_{0}, peak_{0};
};

}  // namespace strata
