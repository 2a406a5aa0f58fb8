// The counting CPU allocator (cpu_memory.h): each allocation is the wrapped allocator's, handed
// out with a context that remembers its size and gives the bytes back when the tensor dies.
#include "cpu_memory.h"

#include <cstring>

namespace strata::bench {
namespace {

struct Allocation {
  c10::DataPtr inner;
  int64_t bytes;
  CountingCpuAllocator* owner;
};

}  // namespace

CountingCpuAllocator& CountingCpuAllocator::install() {
  static CountingCpuAllocator* instance = [] {
    auto* counting = new CountingCpuAllocator(c10::GetCPUAllocator());  // lives as long as the process
    c10::SetCPUAllocator(counting, /*priority=*/100);
    return counting;
  }();
  return *instance;
}

c10::DataPtr CountingCpuAllocator::allocate(size_t bytes) {
  c10::DataPtr inner = base_->allocate(bytes);
  void* data = inner.get();
  const c10::Device device = inner.device();
  auto* allocation = new Allocation{std::move(inner), static_cast<int64_t>(bytes), this};
  add(allocation->bytes);
  return {data, allocation, &CountingCpuAllocator::release, device};
}

void CountingCpuAllocator::release(void* context) {
  auto* allocation = static_cast<Allocation*>(context);
  allocation->owner->add(-allocation->bytes);
  delete allocation;  // frees the wrapped allocation
}

void CountingCpuAllocator::add(int64_t bytes) {
  const int64_t now = current_.fetch_add(bytes) + bytes;
  int64_t seen = peak_.load();
  while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
  }
}

void CountingCpuAllocator::copy_data(void* dest, const void* src, std::size_t count) const { std::memcpy(dest, src, count); }

}  // namespace strata::bench
