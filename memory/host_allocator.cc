// HostAllocator: aligned_alloc plus bookkeeping so that bad frees are caught.
#include "memory/host_allocator.h"

#include <cstdlib>
#include <new>

#include "base/check.h"

namespace weft::memory {

void* HostAllocator::allocate(size_t bytes, Tag) {
  size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded == 0) rounded = kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (!p) throw std::bad_alloc();
  std::lock_guard<std::mutex> lock(mu_);
  sizes_[p] = bytes;
  stats_.bytes_live += bytes;
  stats_.bytes_reserved += rounded;
  stats_.bytes_live_peak = std::max(stats_.bytes_live_peak, stats_.bytes_live);
  stats_.bytes_reserved_peak = std::max(stats_.bytes_reserved_peak, stats_.bytes_reserved);
  stats_.num_allocs++;
  return p;
}

void HostAllocator::free(void* ptr) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sizes_.find(ptr);
    WEFT_CHECK(it != sizes_.end(), "HostAllocator::free of a pointer it did not allocate: ", ptr);
    size_t bytes = it->second;
    size_t rounded = std::max<size_t>(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
    stats_.bytes_live -= bytes;
    stats_.bytes_reserved -= rounded;
    stats_.num_frees++;
    sizes_.erase(it);
  }
  std::free(ptr);
}

AllocatorStats HostAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

Allocator& default_host_allocator() {
  static HostAllocator* instance = new HostAllocator();  // never destroyed: outlives all tensors
  return *instance;
}

}  // namespace weft::memory
