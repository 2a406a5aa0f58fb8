// MFU's peak (core/src/host/device_peak.cpp): the table's lookups by GPU name and dtype (names
// that contain one another matched in the right order, unknown names and dtypes report none),
// and the peak a run divides by: [job] peak_tflops where set, times the devices; on a CPU
// without it, nothing and no line.
#include <gtest/gtest.h>

#include "strata/core/device_peak.h"

namespace strata {
namespace {

TEST(DevicePeak, LooksUpTheDensePeakByNameAndDtype) {
  EXPECT_DOUBLE_EQ(peak_dense_tflops("NVIDIA H200", c10::ScalarType::BFloat16), 989.4);
  EXPECT_DOUBLE_EQ(peak_dense_tflops("NVIDIA H100 80GB HBM3", c10::ScalarType::BFloat16), 989.4);
  EXPECT_DOUBLE_EQ(peak_dense_tflops("NVIDIA H100 PCIe", c10::ScalarType::Half), 756.0);
  EXPECT_DOUBLE_EQ(peak_dense_tflops("NVIDIA H100 NVL", c10::ScalarType::BFloat16), 835.5);
  EXPECT_DOUBLE_EQ(peak_dense_tflops("NVIDIA A100-SXM4-80GB", c10::ScalarType::BFloat16), 312.0);
  EXPECT_DOUBLE_EQ(peak_dense_tflops("NVIDIA A100-SXM4-80GB", c10::ScalarType::Float), 19.5);
  EXPECT_DOUBLE_EQ(peak_dense_tflops("NVIDIA L40S", c10::ScalarType::BFloat16), 362.1);  // not the L4's
  EXPECT_DOUBLE_EQ(peak_dense_tflops("NVIDIA L4", c10::ScalarType::BFloat16), 121.0);
  EXPECT_DOUBLE_EQ(peak_dense_tflops("Tesla V100-SXM2-16GB", c10::ScalarType::Half), 125.0);
  EXPECT_DOUBLE_EQ(peak_dense_tflops("Tesla V100-SXM2-16GB", c10::ScalarType::BFloat16), 0.0);  // no bf16 units
  EXPECT_DOUBLE_EQ(peak_dense_tflops("NVIDIA GeForce GTX 1080", c10::ScalarType::BFloat16), 0.0);
  EXPECT_DOUBLE_EQ(peak_dense_tflops("NVIDIA H200", c10::ScalarType::Double), 0.0);
  EXPECT_DOUBLE_EQ(peak_dense_tflops("", c10::ScalarType::BFloat16), 0.0);
}

TEST(DevicePeak, ARunDividesByEveryDevicesPeak) {
  const MfuPeak set = mfu_peak(2.5, c10::Device(c10::kCPU), c10::ScalarType::Float, 3);
  EXPECT_DOUBLE_EQ(set.per_device_tflops, 2.5);
  EXPECT_EQ(set.why, "mfu against 2.5 TFLOP/s per device x 3 devices ([job] peak_tflops)");
  const MfuPeak one = mfu_peak(2.5, c10::Device(c10::kCPU), c10::ScalarType::Float, 1);
  EXPECT_EQ(one.why, "mfu against 2.5 TFLOP/s per device ([job] peak_tflops)");
  const MfuPeak cpu = mfu_peak(0, c10::Device(c10::kCPU), c10::ScalarType::BFloat16, 2);
  EXPECT_DOUBLE_EQ(cpu.per_device_tflops, 0.0);
  EXPECT_TRUE(cpu.why.empty());
}

}  // namespace
}  // namespace strata
