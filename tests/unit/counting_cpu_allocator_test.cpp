// The counting CPU allocator (strata/core/counting_cpu_allocator.h): the bytes of live tensors and
// their peak, through tensors and through the raw blocks oneDNN asks for.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "strata/core/counting_cpu_allocator.h"

namespace strata {
namespace {

TEST(CountingCpuAllocator, CountsLiveTensorBytesAndTheirPeak) {
  CountingCpuAllocator& counter = CountingCpuAllocator::install();
  EXPECT_EQ(&counter, &CountingCpuAllocator::install());  // one per process
  const int64_t before = counter.current();
  counter.reset_peak();
  {
    at::Tensor a = at::ones({1000}, at::kFloat);
    EXPECT_EQ(counter.current(), before + 4000);
    {
      at::Tensor b = at::empty({250}, at::kDouble);
      EXPECT_EQ(counter.current(), before + 6000);
    }
    EXPECT_EQ(counter.current(), before + 4000);
    EXPECT_FLOAT_EQ(a.sum().item<float>(), 1000.0f);  // the data is usable where it was handed out
  }
  EXPECT_EQ(counter.current(), before);
  EXPECT_EQ(counter.peak(), before + 6000);
  counter.reset_peak();
  EXPECT_EQ(counter.peak(), before);
}

TEST(CountingCpuAllocator, HandsOutAlignedRawBlocks) {
  CountingCpuAllocator& counter = CountingCpuAllocator::install();
  const int64_t before = counter.current();
  void* block = c10::GetCPUAllocator()->raw_allocate(100);  // oneDNN's way; needs data == context
  EXPECT_EQ(reinterpret_cast<uintptr_t>(block) % c10::gAlignment, 0u);
  EXPECT_EQ(counter.current(), before + 100);
  c10::GetCPUAllocator()->raw_deallocate(block);
  EXPECT_EQ(counter.current(), before);
}

TEST(CountingCpuAllocator, ResizedStorageCountsItsNewSize) {
  CountingCpuAllocator& counter = CountingCpuAllocator::install();
  const int64_t before = counter.current();
  at::Tensor t = at::zeros({10}, at::kFloat);
  t.resize_({100});
  EXPECT_EQ(counter.current(), before + 400);
}

}  // namespace
}  // namespace strata
