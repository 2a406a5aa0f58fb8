// The CPU's features through libtorch's own reading of them (at::cpu::get_cpu_capabilities,
// cpuinfo underneath), and the record of which CPU fast path serves (cpu_features.h).
#include "strata/core/cpu_features.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>

#include <ATen/Version.h>
#include <ATen/cpu/Utils.h>

#include "strata/core/log.h"

namespace strata {

namespace {

std::string model_name(const std::unordered_map<std::string, c10::IValue>& caps) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);)
    if (line.rfind("model name", 0) == 0) {
      std::string name = line.substr(line.find(':') + 1);
      name.erase(0, name.find_first_not_of(" \t"));
      if (!name.empty()) return name;
    }
  const auto it = caps.find("cpu_name");
  return it != caps.end() && it->second.isString() ? it->second.toStringRef() : "unknown";
}

CpuFeatures read_features() {
  const auto caps = at::cpu::get_cpu_capabilities();
  const auto has = [&caps](const char* key) {
    const auto it = caps.find(key);
    return it != caps.end() && it->second.isBool() && it->second.toBool();
  };
  CpuFeatures f;
  f.model = model_name(caps);
  f.avx2 = has("avx2"), f.fma = has("fma3"), f.f16c = has("f16c");
  f.avx512 = has("avx512_f") && has("avx512_bw") && has("avx512_vl") && has("avx512_dq");
  f.avx512_bf16 = has("avx512_bf16"), f.avx512_fp16 = has("avx512_fp16"), f.avx512_vnni = has("avx512_vnni");
  f.avx_vnni = has("avx_vnni"), f.avx_ne_convert = has("avx_ne_convert");
  f.amx_tile = has("amx_tile"), f.amx_bf16 = has("amx_bf16"), f.amx_int8 = has("amx_int8"), f.amx_fp16 = has("amx_fp16");
  f.aten_capability = at::get_cpu_capability();
  for (const char* name : {"ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"})
    if (const char* value = std::getenv(name); value && *value && f.onednn_max_isa.empty()) f.onednn_max_isa = value;
  return f;
}

struct PathRecord {
  std::mutex mutex;
  std::vector<CpuPathChoice> choices;
};

PathRecord& path_record() {
  static PathRecord record;
  return record;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = read_features();
  return features;
}

std::string cpu_features_line() {
  const CpuFeatures& f = cpu_features();
  std::string out;
  const std::pair<bool, const char*> named[] = {
      {f.avx2, "AVX2"},           {f.fma, "FMA"},           {f.f16c, "F16C"},           {f.avx512, "AVX-512"},
      {f.avx512_vnni, "AVX512-VNNI"}, {f.avx512_bf16, "AVX512-BF16"}, {f.avx512_fp16, "AVX512-FP16"},
      {f.avx_vnni, "AVX-VNNI"},   {f.avx_ne_convert, "AVX-NE-CONVERT"}, {f.amx_bf16, "AMX-BF16"},
      {f.amx_int8, "AMX-INT8"},   {f.amx_fp16, "AMX-FP16"}};
  for (const auto& [present, name] : named)
    if (present) out += (out.empty() ? "" : " ") + std::string(name);
  if (!f.avx512) out += std::string(out.empty() ? "" : " ") + "(no AVX-512)";
  out += "; ATen kernels " + f.aten_capability;
  if (!f.onednn_max_isa.empty()) out += "; ONEDNN_MAX_CPU_ISA=" + f.onednn_max_isa;
  return out;
}

bool cpu_has(CpuFeature feature) {
  const CpuFeatures& f = cpu_features();
  switch (feature) {
    case CpuFeature::avx2: return f.avx2;
    case CpuFeature::fma: return f.fma;
    case CpuFeature::f16c: return f.f16c;
    case CpuFeature::avx512: return f.avx512;
    case CpuFeature::avx512_bf16: return f.avx512_bf16;
    case CpuFeature::avx512_fp16: return f.avx512_fp16;
    case CpuFeature::avx512_vnni: return f.avx512_vnni;
    case CpuFeature::avx_vnni: return f.avx_vnni;
    case CpuFeature::avx_ne_convert: return f.avx_ne_convert;
    case CpuFeature::amx_tile: return f.amx_tile;
    case CpuFeature::amx_bf16: return f.amx_bf16;
    case CpuFeature::amx_int8: return f.amx_int8;
    case CpuFeature::amx_fp16: return f.amx_fp16;
  }
  return false;  // a feature a newer plugin names: not known here, so not used
}

void record_cpu_path(const std::string& path, const std::string& serves, const std::string& chosen,
                     const std::string& why, bool fast) {
  const CpuPathChoice choice{path, serves, chosen, why, fast};
  PathRecord& record = path_record();
  {
    const std::lock_guard<std::mutex> lock(record.mutex);
    const auto same = std::find_if(record.choices.begin(), record.choices.end(),
                                   [&](const CpuPathChoice& c) { return c.path == choice.path; });
    if (same != record.choices.end()) *same = choice;
    else record.choices.push_back(choice);
  }
  log::record("cpu path " + choice.path + " (" + choice.serves + "): " + choice.chosen + " - " + choice.why);
}

std::vector<CpuPathChoice> cpu_paths() {
  PathRecord& record = path_record();
  const std::lock_guard<std::mutex> lock(record.mutex);
  return record.choices;
}

bool cpu_fallback_forced(const std::string& path) {
  const char* value = std::getenv("STRATA_CPU_FALLBACK");
  if (!value) return false;
  std::istringstream names(value);
  for (std::string name; std::getline(names, name, ',');) {
    name.erase(0, name.find_first_not_of(' '));
    name.erase(name.find_last_not_of(' ') + 1);
    if (name == "all" || name == path) return true;
  }
  return false;
}

}  // namespace strata
