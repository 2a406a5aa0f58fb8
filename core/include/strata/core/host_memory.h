// [job] host_memory: whether host memory that tensors free stays in the process for the next
// step's tensors ("keep": glibc's heap keeps it; "cache": the counting allocator keeps large blocks
// by size, a step at a time) or goes back to the system as glibc decides ("return").
#pragma once

#include <string>

#include "strata/export.h"

namespace strata {

// Process-wide; call before the model and data are built. Without glibc, "keep" changes nothing.
// With "cache", call CountingCpuAllocator::install().trim_idle_blocks() as each step starts.
STRATA_API void configure_host_memory(const std::string& mode);

}  // namespace strata
