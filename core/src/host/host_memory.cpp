// Host memory reuse across steps. libtorch's CPU tensors come from glibc's malloc, which maps a
// block above its mmap threshold (128 KiB, rising with what is freed, to 32 MiB at most) for the
// tensor alone and unmaps it when freed, and trims the heap's free top back to the system. A step
// allocates and frees the same activations every time, so with those defaults it faults many of
// their pages in again, page by page, every step. "keep" raises both thresholds to 1 GiB, so
// what a step frees stays in the heap for the next one: the bench's Llama step (2048 tokens,
// d_model 256, vocab 4096) went from about 420 to 160 thousand minor faults in 8 steps and
// 0.89x the time on one thread (docs/performance.md). The price: the heap keeps what it held,
// so the resident peak can be higher.
#include "strata/core/host_memory.h"

#include <malloc.h>

#include "strata/errors.h"

namespace strata {

void configure_host_memory(const std::string& mode) {
  if (mode == "return") return;
  if (mode != "keep") throw UserError("[job] host_memory = \"" + mode + "\" is not one of keep, return");
#if defined(__GLIBC__)
  constexpr int kKeepBelow = 1 << 30;
  ::mallopt(M_MMAP_THRESHOLD, kKeepBelow);
  ::mallopt(M_TRIM_THRESHOLD, kKeepBelow);
#endif
}

}  // namespace strata
