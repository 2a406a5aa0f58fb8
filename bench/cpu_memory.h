// Measured CPU memory for benches: an allocator that wraps ATen's CPU allocator and counts the
// bytes of live tensors, with a resettable peak, so a bench reports the bytes an implementation
// actually allocated next to the formula. Only tensor storage is counted (not BLAS or OpenMP
// scratch that bypasses ATen's allocator).
#pragma once

#include <atomic>
#include <cstdint>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

namespace strata::bench {

class CountingCpuAllocator final : public c10::Allocator {
 public:
  // Installs one counting allocator in front of the current CPU allocator (once) and returns it.
  static CountingCpuAllocator& install();

  int64_t current() const { return current_.load(); }
  int64_t peak() const { return peak_.load(); }
  void reset_peak() { peak_.store(current_.load()); }

  c10::DataPtr allocate(size_t bytes) override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

 private:
  explicit CountingCpuAllocator(c10::Allocator* base) : base_(base) {}
  static void release(void* context);
  void add(int64_t bytes);

  c10::Allocator* base_;
  std::atomic<int64_t> current_{0}, peak_{0};
};

}  // namespace strata::bench
