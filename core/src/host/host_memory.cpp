// Host memory reuse across steps. libtorch's CPU tensors come from glibc's malloc, which maps a
// block above its mmap threshold (128 KiB, rising with what is freed, to 32 MiB at most) for the
// tensor alone and unmaps it when freed, and trims the heap's free top back to the system. A step
// allocates and frees the same activations every time, so with those defaults it faults many of
// their pages in again, page by page, every step. "keep" raises both thresholds to 1 GiB, so
// what a step frees stays in the heap for the next one: the bench's Llama step (2048 tokens,
// d_model 256, vocab 4096) went from about 420 to 160 thousand minor faults in 8 steps and
// 0.89x the time on one thread (docs/performance.md). The price: the heap keeps what it held,
// so the resident peak can be higher. "cache" also has the counting allocator keep freed blocks of
// 128 KiB and more for the next tensor of the same size, giving back what a whole step did not
// take (counting_cpu_allocator.h): the shapes a step repeats reuse their own blocks, where glibc's
// heap hands a freed block to whatever asks next and grows around the pieces. Measured
// (bench/results/host_memory_cpu.md): fsdp over 4 ranks of a 201 M GPT held 2094 MiB resident
// with "keep", 1012 with "return" (at 1.8x keep's step time) and 1058 with "cache", at keep's time.
#include "strata/core/host_memory.h"

#include <malloc.h>

#include "strata/core/counting_cpu_allocator.h"
#include "strata/errors.h"

namespace strata {

void configure_host_memory(const std::string& mode) {
  if (mode != "keep" && mode != "return" && mode != "cache")
    throw UserError("[job] host_memory = \"" + mode + "\" is not one of keep, return, cache");
  constexpr size_t kCachedFrom = 128 << 10;  // glibc's initial mmap threshold: smaller blocks come from its heap
  CountingCpuAllocator::install().enable_block_cache(mode == "cache" ? kCachedFrom : 0);  // a later trainer's mode replaces it
  if (mode == "return") return;
#if defined(__GLIBC__)
  constexpr int kKeepBelow = 1 << 30;
  ::mallopt(M_MMAP_THRESHOLD, kKeepBelow);
  ::mallopt(M_TRIM_THRESHOLD, kKeepBelow);
#endif
}

}  // namespace strata
