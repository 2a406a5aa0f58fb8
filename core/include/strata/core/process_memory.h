// The memory this process holds now, as the operating system counts it (resident set): what the
// step log prints, what `strata doctor` reports a rank starts with, and what `strata tune` adds to
// the model states and activations it predicts.
#pragma once

#include <string>

#include "strata/export.h"

namespace strata {

STRATA_API double resident_bytes();
// The most this process has held at once so far (the high-water mark of its resident set).
STRATA_API double peak_resident_bytes();
// Hands memory the allocator keeps after frees back to the operating system (glibc's malloc_trim;
// nothing elsewhere). Building a model drops one large block after another; glibc keeps much of
// what they held, so without this a sharded build's peak was 1.7x its formula (GPT-2 medium).
STRATA_API void release_free_memory();

// The private memory this process has allocated (VmData: anonymous and private writable mappings,
// touched or not; mapped files read-only and shared memory do not count).
STRATA_API double allocated_bytes();
// [job] rank_memory_limit_mb: caps what this process may allocate from now on at `bytes` more
// than it holds now, with the operating system's data limit (RLIMIT_DATA = allocated_bytes() +
// bytes), so an allocation past it fails instead of the machine swapping or the kernel's OOM
// killer choosing a process. Returns the limit set; UserError if the system refuses it.
STRATA_API double cap_allocations(double bytes);
// The cap set by cap_allocations (its `bytes`), or 0.
STRATA_API double allocation_cap();
// Whether `what` (an exception's message) says an allocation failed.
STRATA_API bool is_allocation_failure(const std::string& what);

}  // namespace strata
