// The memory this process holds now, as the operating system counts it (resident set): what the
// step log prints, what `strata doctor` reports a rank starts with, and what `strata tune` adds to
// the model states and activations it predicts.
#pragma once

#include "strata/export.h"

namespace strata {

STRATA_API double resident_bytes();
// The most this process has held at once so far (the high-water mark of its resident set).
STRATA_API double peak_resident_bytes();
// Hands memory the allocator keeps after frees back to the operating system (glibc's malloc_trim;
// nothing elsewhere). Building a model drops one large block after another; glibc keeps much of
// what they held, so without this a sharded build's peak was 1.7x its formula (GPT-2 medium).
STRATA_API void release_free_memory();

}  // namespace strata
