// Peak throughput for MFU (device_peak.h). The name comes from the CUDA driver API (libcuda.so.1,
// found at run time: core links no CUDA library), so it is known before any kernel runs.
#include "strata/core/device_peak.h"

#include <dlfcn.h>

#include <array>
#include <cstdio>

namespace strata {
namespace {

// First match wins, so a name that contains another comes before it ("H100 PCIe" before "H100",
// "L40S" before "L4"). Dense TFLOP/s from NVIDIA's data sheets (their sparse figures halved);
// 0: no such unit or not known here.
struct Row {
  const char* name_part;
  double half;  // bf16 (and fp16) tensor core, dense
  double fp16;  // fp16 tensor core, dense, where it differs from bf16's (V100 has no bf16)
  double fp32;  // FP32, no TF32
};
constexpr std::array<Row, 10> kPeaks{{
    {"H100 PCIe", 756.0, 756.0, 51.2},
    {"H100 NVL", 835.5, 835.5, 60.0},
    {"H200 NVL", 835.5, 835.5, 60.0},
    {"H200", 989.4, 989.4, 66.9},  // H200 SXM
    {"H100", 989.4, 989.4, 66.9},  // H100 SXM ("NVIDIA H100 80GB HBM3")
    {"GH200", 989.4, 989.4, 66.9},
    {"A100", 312.0, 312.0, 19.5},
    {"L40S", 362.1, 362.1, 91.6},
    {"L4", 121.0, 121.0, 30.3},
    {"V100", 0.0, 125.0, 15.7},
}};

}  // namespace

double peak_dense_tflops(std::string_view device_name, c10::ScalarType dtype) {
  for (const Row& row : kPeaks)
    if (device_name.find(row.name_part) != std::string_view::npos) {
      if (dtype == c10::ScalarType::BFloat16) return row.half;
      if (dtype == c10::ScalarType::Half) return row.fp16;
      if (dtype == c10::ScalarType::Float) return row.fp32;
      return 0.0;
    }
  return 0.0;
}

std::string cuda_device_name(int ordinal) {
  // The driver libtorch_cuda uses; RTLD_NOLOAD first, so nothing is loaded that was not.
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
  if (!driver) driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (!driver) return {};
  using Init = int (*)(unsigned);
  using DeviceGet = int (*)(int*, int);
  using DeviceGetName = int (*)(char*, int, int);
  const auto init = reinterpret_cast<Init>(dlsym(driver, "cuInit"));
  const auto device_get = reinterpret_cast<DeviceGet>(dlsym(driver, "cuDeviceGet"));
  const auto device_get_name = reinterpret_cast<DeviceGetName>(dlsym(driver, "cuDeviceGetName"));
  int device = 0;
  std::array<char, 256> name{};
  if (!init || !device_get || !device_get_name || init(0) != 0 || device_get(&device, ordinal) != 0 ||
      device_get_name(name.data(), static_cast<int>(name.size()), device) != 0)
    return {};
  return std::string(name.data());
}

MfuPeak mfu_peak(double configured, c10::Device device, c10::ScalarType compute_dtype, int64_t devices) {
  const std::string times = devices > 1 ? " x " + std::to_string(devices) + " devices" : "";
  char tflops[32];
  if (configured > 0) {
    std::snprintf(tflops, sizeof tflops, "%.1f", configured);
    return {configured, std::string("mfu against ") + tflops + " TFLOP/s per device" + times + " ([job] peak_tflops)"};
  }
  if (!device.is_cuda()) return {0, ""};  // a CPU's peak depends on more than its name: only where set
  const std::string name = cuda_device_name(device.has_index() ? device.index() : 0);
  const double peak = peak_dense_tflops(name, compute_dtype);
  const std::string dtype = c10::toString(compute_dtype);
  if (peak <= 0)
    return {0, "mfu not reported: no " + dtype + " peak known for '" + (name.empty() ? "this GPU" : name) +
                   "'; set [job] peak_tflops (one device's dense peak)"};
  std::snprintf(tflops, sizeof tflops, "%.1f", peak);
  return {peak, std::string("mfu against ") + tflops + " TFLOP/s per device" + times + " (" + name + ", " + dtype +
                    " dense, from its name; [job] peak_tflops overrides)"};
}

}  // namespace strata
