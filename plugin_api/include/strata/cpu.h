// The CPU services a plugin with CPU fast paths uses: what this CPU has, whether the user forced a
// path's fallback (STRATA_CPU_FALLBACK), and the record of which path serves and why (what
// `strata ops`, `strata doctor` and the rank log show).
//
// A fast path is decided once per process by its owner: the CPU's features, then a trial call of
// the library itself. Free functions and an enum only: nothing here has a layout that core and a
// plugin must agree on, so features and services are added without a new major.
#pragma once

#include <string>

#include "strata/export.h"

namespace strata {

// As libtorch's cpuinfo reads them (x86-64; all false elsewhere). New features are appended.
enum class CpuFeature : int {
  avx2 = 0, fma = 1, f16c = 2,
  avx512 = 3,  // F, BW, VL and DQ: what oneDNN's and ATen's AVX-512 paths need
  avx512_bf16 = 4, avx512_fp16 = 5, avx512_vnni = 6, avx_vnni = 7, avx_ne_convert = 8,
  amx_tile = 9, amx_bf16 = 10, amx_int8 = 11, amx_fp16 = 12,
};
STRATA_API bool cpu_has(CpuFeature feature);

// Whether STRATA_CPU_FALLBACK (comma separated path keys, or "all") forces `path`'s fallback.
STRATA_API bool cpu_fallback_forced(const std::string& path);

// Records a decision (replacing an earlier one for the same path) and writes it to the rank log:
// `path` is the fast path's key (what STRATA_CPU_FALLBACK names), `serves` what it is for,
// `chosen` what serves on this machine, `why` the reason in a user's words. Thread-safe.
STRATA_API void record_cpu_path(const std::string& path, const std::string& serves, const std::string& chosen,
                                const std::string& why, bool fast);

// One decision as its owner writes it. Compiled into the plugin; it never crosses into core.
struct CpuPathChoice {
  std::string path;
  std::string serves;
  std::string chosen;
  std::string why;
  bool fast = false;  // the fast path was chosen
};

// Runs `decide`, records its choice and returns whether the fast path was chosen. The owner keeps
// the result in a function-local static, so that the path is decided once.
inline bool decide_cpu_path(CpuPathChoice (*decide)()) {
  const CpuPathChoice choice = decide();
  record_cpu_path(choice.path, choice.serves, choice.chosen, choice.why, choice.fast);
  return choice.fast;
}

}  // namespace strata
