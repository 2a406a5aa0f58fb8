// The counting CPU allocator (counting_cpu_allocator.h). Each allocation is the wrapped
// allocator's raw block with a header of one alignment unit in front that remembers its size:
// oneDNN asks the CPU allocator for raw blocks (Allocator::raw_allocate), which needs the pointer
// handed out to be its own deleter's context, so the size cannot live in a separate context.
#include "strata/core/counting_cpu_allocator.h"

#include <cstring>
#include <stdexcept>

namespace strata {
namespace {

constexpr size_t kHeader = c10::gAlignment;  // keeps the data as aligned as the wrapped block

CountingCpuAllocator* the_instance = nullptr;  // what release() counts against; set once by install()

}  // namespace

CountingCpuAllocator& CountingCpuAllocator::install() {
  static const bool installed = [] {
    c10::Allocator* base = c10::GetCPUAllocator();
    if (base->raw_deleter() == nullptr) throw std::logic_error("the CPU allocator hands out no raw blocks to count");
    the_instance = new CountingCpuAllocator(base);  // lives as long as the process
    c10::SetCPUAllocator(the_instance, /*priority=*/100);
    return true;
  }();
  (void)installed;
  return *the_instance;
}

c10::DataPtr CountingCpuAllocator::allocate(size_t bytes) {
  auto* block = static_cast<char*>(base_->raw_allocate(bytes + kHeader));
  std::memcpy(block, &bytes, sizeof bytes);
  add(static_cast<int64_t>(bytes));
  void* data = block + kHeader;
  return {data, data, &CountingCpuAllocator::release, c10::Device(c10::DeviceType::CPU)};
}

c10::DeleterFnPtr CountingCpuAllocator::raw_deleter() const { return &CountingCpuAllocator::release; }

void CountingCpuAllocator::release(void* data) {
  if (data == nullptr) return;
  char* block = static_cast<char*>(data) - kHeader;
  size_t bytes = 0;
  std::memcpy(&bytes, block, sizeof bytes);
  the_instance->add(-static_cast<int64_t>(bytes));
  the_instance->base_->raw_deallocate(block);
}

void CountingCpuAllocator::add(int64_t bytes) {
  const int64_t now = current_.fetch_add(bytes) + bytes;
  int64_t seen = peak_.load();
  while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
  }
}

void CountingCpuAllocator::copy_data(void* dest, const void* src, std::size_t count) const { std::memcpy(dest, src, count); }

}  // namespace strata
