// The peak MFU divides by. MFU = training FLOPs per token x tokens per second over the peak of
// every device that computes them; one device's peak is [job] peak_tflops where it is set, else
// it is looked up from the GPU's name and the dtype the blocks compute in (NVIDIA's datasheets,
// dense, without sparsity). torchtitan reported 200% MFU on B200 until its peak table was fixed:
// the table says where each number comes from and unknown names report no MFU.
#pragma once

#include <string>
#include <string_view>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "strata/export.h"

namespace strata {

// One device's dense peak in TFLOP/s: bf16 and fp16 on tensor cores; float as FP32 without TF32
// (Strata keeps fp32 matrix products in fp32). 0 where the name or the dtype is not in the table.
STRATA_API double peak_dense_tflops(std::string_view device_name, c10::ScalarType dtype);

// The GPU's name as the driver gives it ("NVIDIA H200"); empty where there is no driver or no
// such device.
STRATA_API std::string cuda_device_name(int ordinal);

struct MfuPeak {
  double per_device_tflops = 0;  // 0: MFU not reported
  std::string why;               // one line for the log: where the number came from, or why none (empty on a CPU without one)
};

// configured: [job] peak_tflops (0: look it up). devices: the ranks computing the step's tokens.
STRATA_API MfuPeak mfu_peak(double configured, c10::Device device, c10::ScalarType compute_dtype, int64_t devices);

}  // namespace strata
