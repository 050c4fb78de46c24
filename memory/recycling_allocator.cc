// RecyclingAllocator: exact-size reuse of large freed blocks until trim().
#include "memory/recycling_allocator.h"

#include <algorithm>

#include "base/check.h"

namespace weft::memory {

namespace {
constexpr size_t kPage = 4096;  // the smallest page size of the hosts Weft runs on
}  // namespace

RecyclingAllocator::RecyclingAllocator(Allocator& base, size_t min_bytes)
    : base_(base), min_bytes_(min_bytes) {}

RecyclingAllocator::~RecyclingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  trim_locked();
}

void* RecyclingAllocator::allocate(size_t bytes, Tag tag) {
  std::unique_lock<std::mutex> lock(mu_);
  void* p = nullptr;
  if (bytes >= min_bytes_) {
    auto it = kept_.find(bytes);
    if (it != kept_.end()) {
      p = it->second;
      kept_.erase(it);
      bytes_kept_ -= bytes;
      ++reused_;
    } else {
      trim_locked();
    }
  }
  if (!p) {
    lock.unlock();  // the base may take a while (the system's allocator)
    p = base_.allocate(bytes, tag);
    lock.lock();
  }
  live_[p] = bytes;
  stats_.bytes_live += bytes;
  stats_.bytes_reserved = stats_.bytes_live + bytes_kept_;
  stats_.bytes_live_peak = std::max(stats_.bytes_live_peak, stats_.bytes_live);
  stats_.bytes_reserved_peak = std::max(stats_.bytes_reserved_peak, stats_.bytes_reserved);
  stats_.num_allocs++;
  return p;
}

void RecyclingAllocator::free(void* ptr) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  WEFT_CHECK(it != live_.end(), "RecyclingAllocator::free of a pointer it did not hand out: ", ptr);
  const size_t bytes = it->second;
  live_.erase(it);
  stats_.bytes_live -= bytes;
  stats_.num_frees++;
  if (bytes >= min_bytes_) {
    kept_.emplace(bytes, ptr);
    bytes_kept_ += bytes;
    stats_.bytes_reserved = stats_.bytes_live + bytes_kept_;
    return;
  }
  stats_.bytes_reserved = stats_.bytes_live + bytes_kept_;
  lock.unlock();
  base_.free(ptr);
}

AllocatorStats RecyclingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void RecyclingAllocator::reserve(const std::vector<size_t>& sizes) {
  // Only what the kept blocks do not cover already (a second call for the same sizes, or
  // blocks a trainer freed, reserve nothing more).
  std::map<size_t, size_t> want;
  for (size_t bytes : sizes)
    if (bytes >= min_bytes_) ++want[bytes];
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [bytes, n] : want) n -= std::min(n, kept_.count(bytes));
  }
  for (const auto& [bytes, n] : want)
    for (size_t i = 0; i < n; ++i) {
      void* p = base_.allocate(bytes, Tag::kOther);
      // One write per page faults it in (a memset would write every byte again).
      for (size_t at = 0; at < bytes; at += kPage) static_cast<volatile char*>(p)[at] = 0;
      std::lock_guard<std::mutex> lock(mu_);
      kept_.emplace(bytes, p);
      bytes_kept_ += bytes;
      stats_.bytes_reserved = stats_.bytes_live + bytes_kept_;
      stats_.bytes_reserved_peak = std::max(stats_.bytes_reserved_peak, stats_.bytes_reserved);
    }
}

void RecyclingAllocator::trim() {
  std::lock_guard<std::mutex> lock(mu_);
  trim_locked();
}

void RecyclingAllocator::trim_locked() {
  for (const auto& [bytes, p] : kept_) base_.free(p);
  kept_.clear();
  bytes_kept_ = 0;
  stats_.bytes_reserved = stats_.bytes_live;
}

size_t RecyclingAllocator::bytes_kept() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_kept_;
}

size_t RecyclingAllocator::reused() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reused_;
}

}  // namespace weft::memory
