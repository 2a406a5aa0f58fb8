// What this CPU can run, and which of Strata's CPU fast paths serve on it: core's view (the
// model name, every feature at once, the decisions recorded). Plugins use strata/cpu.h.
//
// Strata's CPU kernels call libraries whose fast paths need particular instruction sets: oneDNN's
// matmul (the Linear weight gradient) refuses to run without AVX-512 BW/VL/DQ or AVX-NE-CONVERT,
// whatever the dtype; oneDNN's batch-reduce micro-kernel (attention's tile products) exists only
// for some ISAs; fp8's _scaled_mm on the CPU goes through oneDNN where ATen finds AMX. A machine
// without them (an AMD EPYC Zen 3 has AVX2 only) must take the next correct path, never crash.
//
// So each fast path is decided once per process, when the plugin that owns it loads (and at its
// first use where nothing loaded it), by the path's owner: the CPU's features as libtorch's cpuinfo reports them, then a trial call
// of the library itself (the library's own check may depend on more than the CPU, e.g. oneDNN's
// ONEDNN_MAX_CPU_ISA). The decision and its reason are recorded here, so that `strata ops`, the
// rank log and `strata doctor` can say which path serves and why. STRATA_CPU_FALLBACK forces the
// fallbacks, so that a test proves both paths on whichever CPU runs it.
#pragma once

#include <string>
#include <vector>

#include "strata/cpu.h"
#include "strata/export.h"

namespace strata {

// The features that decide a CPU path, as libtorch's cpuinfo reads them (x86-64; all false
// elsewhere), and the model name.
struct CpuFeatures {
  std::string model;          // "AMD EPYC 7B13", from /proc/cpuinfo; "unknown" where absent
  bool avx2 = false, fma = false, f16c = false;
  bool avx512 = false;        // F, BW, VL and DQ: what oneDNN's and ATen's AVX-512 paths need
  bool avx512_bf16 = false, avx512_fp16 = false, avx512_vnni = false;
  bool avx_vnni = false, avx_ne_convert = false;
  bool amx_tile = false, amx_bf16 = false, amx_int8 = false, amx_fp16 = false;
  std::string aten_capability;  // ATen's kernels' copy: "DEFAULT", "AVX2", "AVX512" (ATEN_CPU_CAPABILITY may lower it)
  std::string onednn_max_isa;   // ONEDNN_MAX_CPU_ISA (or DNNL_MAX_CPU_ISA) as set, or empty
};

STRATA_API const CpuFeatures& cpu_features();
// The features as one line: "AVX2 FMA F16C AVX-512 AVX512-BF16 AMX-BF16 ...; ATen kernels AVX512".
STRATA_API std::string cpu_features_line();

// Every decision recorded in this process so far, in the order first recorded.
STRATA_API std::vector<CpuPathChoice> cpu_paths();


}  // namespace strata
