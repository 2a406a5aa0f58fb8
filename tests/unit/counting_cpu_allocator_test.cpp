// The counting CPU allocator (strata/core/counting_cpu_allocator.h): the bytes of live tensors and
// their peak, through tensors and through the raw blocks oneDNN asks for.
#include <sys/resource.h>

#include <cstdlib>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "strata/core/process_memory.h"

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

// [job] host_memory = "cache": a freed block of the cached sizes serves the next tensor of its
// size, counted as free while it waits; what a whole step did not take goes back.
constexpr size_t kMiB = 1 << 20;

TEST(CountingCpuAllocator, CachedBlockServesTheNextTensorOfItsSize) {
  CountingCpuAllocator& counter = CountingCpuAllocator::install();
  counter.enable_block_cache(kMiB);
  const int64_t before = counter.current();
  void* first = nullptr;
  {
    at::Tensor a = at::empty({2 * static_cast<int64_t>(kMiB)}, at::kByte);
    first = a.data_ptr();
  }
  EXPECT_EQ(counter.current(), before);  // waiting in the cache is not live
  EXPECT_EQ(counter.cached_bytes(), static_cast<int64_t>(2 * kMiB));
  {
    at::Tensor other_size = at::empty({3 * static_cast<int64_t>(kMiB)}, at::kByte);
    EXPECT_NE(other_size.data_ptr(), first);
    at::Tensor b = at::empty({2 * static_cast<int64_t>(kMiB)}, at::kByte);
    EXPECT_EQ(b.data_ptr(), first);
    EXPECT_EQ(counter.current(), before + static_cast<int64_t>(5 * kMiB));
    EXPECT_EQ(counter.cached_bytes(), 0);
    b.fill_(7);
    EXPECT_EQ(b.data_ptr<uint8_t>()[2 * kMiB - 1], 7);
  }
  EXPECT_EQ(counter.cached_bytes(), static_cast<int64_t>(5 * kMiB));
  { at::Tensor small = at::empty({static_cast<int64_t>(kMiB) - 1}, at::kByte); }  // below the cached sizes
  EXPECT_EQ(counter.cached_bytes(), static_cast<int64_t>(5 * kMiB));
  counter.enable_block_cache(0);  // off: every cached block goes back
  EXPECT_EQ(counter.cached_bytes(), 0);
  EXPECT_EQ(counter.current(), before);
}

TEST(CountingCpuAllocator, TrimGivesBackWhatAWholeStepDidNotTake) {
  CountingCpuAllocator& counter = CountingCpuAllocator::install();
  counter.enable_block_cache(kMiB);
  counter.trim_idle_blocks();
  { at::Tensor once = at::empty({4 * static_cast<int64_t>(kMiB)}, at::kByte); }  // allocated in one step only
  for (int step = 0; step < 3; ++step) {
    counter.trim_idle_blocks();  // as each step starts
    at::Tensor every_step = at::empty({2 * static_cast<int64_t>(kMiB)}, at::kByte);
  }
  // The 4 MiB block waited through a whole step untaken and went back at the second trim; the
  // 2 MiB block every step takes stays.
  EXPECT_EQ(counter.cached_bytes(), static_cast<int64_t>(2 * kMiB));
  counter.trim_idle_blocks();
  EXPECT_EQ(counter.cached_bytes(), static_cast<int64_t>(2 * kMiB));  // cached in the step just ended
  counter.trim_idle_blocks();
  EXPECT_EQ(counter.cached_bytes(), 0);
  counter.enable_block_cache(0);
}

// Under a rank's memory cap (RLIMIT_DATA), an allocation the system refuses gives the cached
// blocks back and is tried again.
TEST(CountingCpuAllocatorDeathTest, RefusedAllocationGivesBackTheCacheAndRetries) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        CountingCpuAllocator& counter = CountingCpuAllocator::install();
        counter.enable_block_cache(kMiB);
        struct rlimit limit {};
        ::getrlimit(RLIMIT_DATA, &limit);
        limit.rlim_cur = static_cast<rlim_t>(allocated_bytes()) + 96 * kMiB;
        if (::setrlimit(RLIMIT_DATA, &limit) != 0) std::exit(3);
        { at::Tensor a = at::empty({64 * static_cast<int64_t>(kMiB)}, at::kByte); }
        if (counter.cached_bytes() != static_cast<int64_t>(64 * kMiB)) std::exit(4);
        at::Tensor b = at::empty({48 * static_cast<int64_t>(kMiB)}, at::kByte);  // 64 + 48 MiB is over the cap
        std::exit(counter.cached_bytes() == 0 ? 0 : 5);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace strata
