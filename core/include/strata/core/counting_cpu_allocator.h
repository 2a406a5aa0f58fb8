// Measured CPU memory: an allocator in front of ATen's CPU allocator that counts the bytes of live
// tensors, with a resettable peak. A training run on the CPU reports its peak as
// `mem_device_peak_bytes` (what CUDA's caching allocator reports on a GPU), and the benches put
// the bytes an implementation actually allocated next to the formula. Unlike the resident set it
// does not see what malloc keeps after a free ([job] host_memory = "keep" keeps it all), so two
// layouts' tensors compare exactly. Only tensor storage is counted (not BLAS or OpenMP scratch
// that bypasses ATen's allocator), and only what is allocated after install().
//
// With the block cache on ([job] host_memory = "cache"), it is also what CUDA's caching allocator
// is to a GPU: a freed block of at least `min_bytes` waits in a list of its exact size and serves
// the next allocation of that size with its pages already in memory, where glibc's heap would
// hand it to whatever asks next and grow around the pieces, or with its defaults unmap it and fault
// each 4 KiB page in again (a training step frees and allocates the same shapes every time:
// fsdp's gathered units, activations, gradients). A cached
// block counts as free (current() is the live tensors, as CUDA's allocated bytes); cached_bytes()
// is what waits. Bounded: trim_idle_blocks(), called as each step starts, gives back the blocks no
// allocation took since the previous call, and an allocation the system refuses (a rank's memory
// cap) gives back every cached block and tries once more.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

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

  // The block cache (above) for blocks of min_bytes and more; off until enabled. 0 turns it off and
  // gives back every cached block (tests).
  void enable_block_cache(size_t min_bytes);
  int64_t cached_bytes() const { return cached_.load(); }
  void trim_idle_blocks();  // no-op with the cache off

  c10::DataPtr allocate(size_t bytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

 private:
  struct CachedBlock {
    char* block;         // the wrapped allocator's block, header included
    int64_t generation;  // trim_idle_blocks() calls before it was cached
  };

  explicit CountingCpuAllocator(c10::Allocator* base) : base_(base) {}
  static void release(void* context);
  void add(int64_t bytes);
  char* take_cached(size_t bytes);
  bool cache(char* block, size_t bytes);
  void free_cached(bool idle_only);

  c10::Allocator* base_;
  std::atomic<int64_t> current_{0}, peak_{0}, cached_{0};
  std::atomic<size_t> cache_min_bytes_{0};  // 0: the cache is off
  std::mutex cache_mutex_;
  std::unordered_map<size_t, std::vector<CachedBlock>> cached_blocks_;  // by the tensor bytes they hold
  int64_t generation_ = 0;
};

}  // namespace strata
