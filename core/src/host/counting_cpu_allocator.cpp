// The counting CPU allocator (counting_cpu_allocator.h). Each allocation is the wrapped
// allocator's raw block with a header of one alignment unit in front that remembers its size:
// oneDNN asks the CPU allocator for raw blocks (Allocator::raw_allocate), which needs the pointer
// handed out to be its own deleter's context, so the size cannot live in a separate context.
#include "strata/core/counting_cpu_allocator.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <stdexcept>

#include <c10/util/Exception.h>

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
  char* block = take_cached(bytes);
  if (block == nullptr) {
    try {
      block = static_cast<char*>(base_->raw_allocate(bytes + kHeader));
    } catch (const c10::Error&) {
      if (cached_.load() == 0) throw;
      free_cached(/*idle_only=*/false);  // the system refused: what waits in the cache goes back first
      block = static_cast<char*>(base_->raw_allocate(bytes + kHeader));
    }
    std::memcpy(block, &bytes, sizeof bytes);
  }
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
  if (!the_instance->cache(block, bytes)) the_instance->base_->raw_deallocate(block);
}

void CountingCpuAllocator::enable_block_cache(size_t min_bytes) {
  cache_min_bytes_.store(min_bytes);
  if (min_bytes == 0) free_cached(/*idle_only=*/false);
}

char* CountingCpuAllocator::take_cached(size_t bytes) {
  const size_t min = cache_min_bytes_.load(std::memory_order_relaxed);
  if (min == 0 || bytes < min) return nullptr;
  std::lock_guard<std::mutex> lock(cache_mutex_);
  auto it = cached_blocks_.find(bytes);
  if (it == cached_blocks_.end() || it->second.empty()) return nullptr;
  char* block = it->second.back().block;  // the most recently freed: its pages are the warmest
  it->second.pop_back();
  cached_.fetch_sub(static_cast<int64_t>(bytes));
  return block;
}

bool CountingCpuAllocator::cache(char* block, size_t bytes) {
  const size_t min = cache_min_bytes_.load(std::memory_order_relaxed);
  if (min == 0 || bytes < min) return false;
  std::lock_guard<std::mutex> lock(cache_mutex_);
  cached_blocks_[bytes].push_back({block, generation_});
  cached_.fetch_add(static_cast<int64_t>(bytes));
  return true;
}

void CountingCpuAllocator::trim_idle_blocks() {
  if (cache_min_bytes_.load() == 0) return;
  free_cached(/*idle_only=*/true);
}

// idle_only: the blocks cached before the previous trim and not taken since (a block each step
// frees and allocates again is taken, cached again and stamped anew); else every cached block.
void CountingCpuAllocator::free_cached(bool idle_only) {
  std::vector<char*> freed;
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    for (auto it = cached_blocks_.begin(); it != cached_blocks_.end();) {
      std::vector<CachedBlock>& blocks = it->second;
      const auto kept = std::stable_partition(blocks.begin(), blocks.end(),
                                              [&](const CachedBlock& b) { return idle_only && b.generation >= generation_; });
      for (auto b = kept; b != blocks.end(); ++b) freed.push_back(b->block);
      cached_.fetch_sub(static_cast<int64_t>(it->first * static_cast<size_t>(blocks.end() - kept)));
      blocks.erase(kept, blocks.end());
      it = blocks.empty() ? cached_blocks_.erase(it) : std::next(it);
    }
    if (idle_only) ++generation_;
  }
  for (char* block : freed) base_->raw_deallocate(block);  // outside the lock: freeing may take a while
}

void CountingCpuAllocator::add(int64_t bytes) {
  const int64_t now = current_.fetch_add(bytes) + bytes;
  int64_t seen = peak_.load();
  while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
  }
}

void CountingCpuAllocator::copy_data(void* dest, const void* src, std::size_t count) const { std::memcpy(dest, src, count); }

}  // namespace strata
