// HostAllocator: aligned blocks plus bookkeeping so that bad frees are caught, and the
// default one's kept blocks (host_allocator.h).
#include "memory/host_allocator.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <new>

#include "base/check.h"
#include "memory/huge_pages.h"

namespace weft::memory {
namespace {

size_t round_block(size_t bytes) {
  const size_t a = Allocator::kAlignment;
  return bytes == 0 ? a : (bytes + a - 1) / a * a;
}

size_t default_keep_cap() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? size_t(pages) * size_t(page) / 32 : size_t(256) << 20;
}

}  // namespace

HostAllocator::HostAllocator(bool keep_freed, size_t keep_cap)
    : keep_freed_(keep_freed), keep_cap_(keep_cap > 0 ? keep_cap : default_keep_cap()) {}

HostAllocator::~HostAllocator() { trim(); }

void* HostAllocator::allocate(size_t bytes, Tag) {
  const size_t rounded = round_block(bytes);
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = kept_by_size_.find(rounded); it != kept_by_size_.end()) {
      auto block = kept_.find(it->second);
      p = block->second.second;
      kept_.erase(block);
      kept_by_size_.erase(it);
      kept_bytes_ -= rounded;
      reused_++;
    } else if (kept_bytes_ > 0) {
      // Without a kept block of this size: keep no more than the live peak leaves room for.
      const size_t after = rounded_live_ + rounded;
      const size_t room = rounded_live_peak_ > after ? rounded_live_peak_ - after : 0;
      if (kept_bytes_ > room) release_kept_locked(kept_bytes_ - room);
    }
  }
  if (!p) p = allocate_host_block(rounded, kAlignment);
  if (!p) throw std::bad_alloc();
  std::lock_guard<std::mutex> lock(mu_);
  sizes_[p] = bytes;
  rounded_live_ += rounded;
  rounded_live_peak_ = std::max(rounded_live_peak_, rounded_live_);
  stats_.bytes_live += bytes;
  stats_.bytes_reserved = rounded_live_ + kept_bytes_;
  stats_.bytes_live_peak = std::max(stats_.bytes_live_peak, stats_.bytes_live);
  stats_.bytes_reserved_peak = std::max(stats_.bytes_reserved_peak, stats_.bytes_reserved);
  stats_.num_allocs++;
  return p;
}

void HostAllocator::free(void* ptr) {
  bool keep = false;
  size_t rounded = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sizes_.find(ptr);
    WEFT_CHECK(it != sizes_.end(), "HostAllocator::free of a pointer it did not allocate: ", ptr);
    const size_t bytes = it->second;
    rounded = round_block(bytes);
    stats_.bytes_live -= bytes;
    rounded_live_ -= rounded;
    stats_.num_frees++;
    sizes_.erase(it);
    // Live plus kept stays what it was: within the peak.
    keep = keep_freed_ && rounded >= kKeepBytes && kept_bytes_ + rounded <= keep_cap_;
    if (keep) {
      const uint64_t age = next_age_++;
      kept_.emplace(age, std::make_pair(rounded, ptr));
      kept_by_size_.emplace(rounded, age);
      kept_bytes_ += rounded;
    }
    stats_.bytes_reserved = rounded_live_ + kept_bytes_;
  }
  if (!keep) free_host_block(ptr, rounded);
}

void* HostAllocator::reshape(void* ptr, size_t bytes) {
  size_t old_bytes = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sizes_.find(ptr);
    WEFT_CHECK(it != sizes_.end(), "HostAllocator::reshape of a pointer it did not allocate: ", ptr);
    old_bytes = it->second;
  }
  const size_t from = round_block(old_bytes), to = round_block(bytes);
  // The caller owns the block: nobody else frees or reshapes it meanwhile.
  void* p = reshape_host_block(ptr, from, to);
  if (!p) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  sizes_.erase(ptr);
  sizes_[p] = bytes;
  rounded_live_ = rounded_live_ - from + to;
  rounded_live_peak_ = std::max(rounded_live_peak_, rounded_live_);
  stats_.bytes_live = stats_.bytes_live - old_bytes + bytes;
  stats_.bytes_reserved = rounded_live_ + kept_bytes_;
  stats_.bytes_live_peak = std::max(stats_.bytes_live_peak, stats_.bytes_live);
  stats_.bytes_reserved_peak = std::max(stats_.bytes_reserved_peak, stats_.bytes_reserved);
  return p;
}

void HostAllocator::release_kept_locked(size_t want_free) {
  size_t freed = 0;
  while (freed < want_free && !kept_.empty()) {
    auto oldest = kept_.begin();
    const auto [rounded, p] = oldest->second;
    auto range = kept_by_size_.equal_range(rounded);
    for (auto it = range.first; it != range.second; ++it)
      if (it->second == oldest->first) {
        kept_by_size_.erase(it);
        break;
      }
    kept_.erase(oldest);
    kept_bytes_ -= rounded;
    freed += rounded;
    // Under the lock: a kept block is no one's, and freeing it does not call back.
    free_host_block(p, rounded);
  }
  stats_.bytes_reserved = rounded_live_ + kept_bytes_;
}

void HostAllocator::trim() {
  std::lock_guard<std::mutex> lock(mu_);
  release_kept_locked(kept_bytes_);
}

size_t HostAllocator::bytes_kept() const {
  std::lock_guard<std::mutex> lock(mu_);
  return kept_bytes_;
}

size_t HostAllocator::reused() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reused_;
}

AllocatorStats HostAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

Allocator& default_host_allocator() {
  // Never destroyed: outlives all tensors. Keeps large freed blocks (host_allocator.h).
  static HostAllocator* instance = new HostAllocator(true);
  return *instance;
}

}  // namespace weft::memory
