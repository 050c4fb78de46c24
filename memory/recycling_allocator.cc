// RecyclingAllocator: exact-size reuse of large freed blocks until trim(), and blocks faulted
// in ahead for the sizes a coming phase is expected to ask for.
#include "memory/recycling_allocator.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>

#include "base/check.h"
#include "base/populate.h"

namespace weft::memory {

namespace {
constexpr size_t kPage = 4096;  // the smallest page size of the hosts Weft runs on

// Faults every page of [p, p + bytes) in, writable. MADV_POPULATE_WRITE does it without a
// trap per page (230 ms for 604 MiB on the bench host against 275 ms for a write per page),
// in 4 MiB pieces (base/populate.h): one call over the block held the process's mmap lock
// throughout, and a recovering survivor's other threads (its snapshot reads, a thread's
// start) waited behind it, the entry's offers 5-135 ms against 0.5-10 ms in pieces. The
// unaligned ends, and every page where the kernel lacks it, get one write each (a memset
// would write every byte again).
//
// In 4 KiB pages, although the block was advised MADV_HUGEPAGE (memory/huge_pages.h): a
// reserve faults in memory that has sat free, and on a VM whose hypervisor takes free memory
// back (virtio-balloon free page reporting, on the bench host) a fresh 2 MiB page then costs
// far more than 512 small ones: 781 MiB populated at 0.3-2.5 GB/s in 2 MiB pages against
// 1.9-2.9 GB/s in 4 KiB ones, and in the leave bench the survivors' reserve took 1.3-2.6 s
// against 0.24-0.49 s. The copies into a reserved block then fault nothing either way.
void fault_in(void* p, size_t bytes) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  const uintptr_t lo = (at + kPage - 1) / kPage * kPage, hi = (at + bytes) / kPage * kPage;
  volatile char* c = static_cast<volatile char*>(p);
  if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_NOHUGEPAGE);
  if (hi > lo && populate_pages(reinterpret_cast<void*>(lo), hi - lo, PageAccess::kWrite) == 0) {
    c[0] = 0;  // the partial pages at both ends
    if (bytes > 0) c[bytes - 1] = 0;
    return;
  }
  for (size_t i = 0; i < bytes; i += kPage) c[i] = 0;
  if (bytes > 0) c[bytes - 1] = 0;
}
}  // namespace

RecyclingAllocator::RecyclingAllocator(Allocator& base, size_t min_bytes)
    : base_(base), min_bytes_(min_bytes) {}

RecyclingAllocator::~RecyclingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  trim_locked();
}

void RecyclingAllocator::update_reserved_locked() {
  stats_.bytes_reserved = stats_.bytes_live + bytes_kept_;
  stats_.bytes_reserved_peak = std::max(stats_.bytes_reserved_peak, stats_.bytes_reserved);
}

void* RecyclingAllocator::allocate(size_t bytes, Tag tag) {
  std::unique_lock<std::mutex> lock(mu_);
  void* p = nullptr;
  if (bytes >= min_bytes_) {
    auto it = kept_.find(bytes);
    // A block of this size being faulted in: waiting for it costs at most what faulting a
    // new one would (less once it is part done).
    while (it == kept_.end() && expecting_ && in_flight_[bytes] > 0) {
      landed_.wait(lock);
      it = kept_.find(bytes);
    }
    if (it != kept_.end()) {
      p = it->second;
      kept_.erase(it);
      bytes_kept_ -= bytes;
      ++reused_;
    } else if (!expecting_) {
      trim_locked();
    }
    if (expecting_)
      if (auto e = expected_.find(bytes); e != expected_.end() && e->second > 0) --e->second;
  }
  if (!p) {
    lock.unlock();  // the base may take a while (the system's allocator)
    p = base_.allocate(bytes, tag);
    lock.lock();
  }
  live_[p] = bytes;
  stats_.bytes_live += bytes;
  stats_.bytes_live_peak = std::max(stats_.bytes_live_peak, stats_.bytes_live);
  update_reserved_locked();
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
  bool keep = bytes >= min_bytes_;
  if (keep && expecting_) {
    auto e = expected_.find(bytes);
    keep = e != expected_.end() && e->second > kept_.count(bytes);
  }
  if (keep) {
    kept_.emplace(bytes, ptr);
    bytes_kept_ += bytes;
  }
  stats_.bytes_reserved = stats_.bytes_live + bytes_kept_;
  if (keep) return;
  lock.unlock();
  base_.free(ptr);
}

AllocatorStats RecyclingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void RecyclingAllocator::take_unwanted_locked(std::vector<void*>& out) {
  for (auto it = kept_.begin(); it != kept_.end();) {
    const size_t bytes = it->first;
    const auto e = expected_.find(bytes);
    const size_t want = expecting_ && e != expected_.end() ? e->second : 0;
    const size_t have = kept_.count(bytes);
    auto next = kept_.upper_bound(bytes);
    for (size_t drop = have > want ? have - want : 0; drop > 0; --drop) {
      auto victim = kept_.find(bytes);
      out.push_back(victim->second);
      bytes_kept_ -= bytes;
      kept_.erase(victim);
    }
    it = next;
  }
  stats_.bytes_reserved = stats_.bytes_live + bytes_kept_;
}

size_t RecyclingAllocator::reserve(const std::vector<size_t>& sizes, size_t max_new_bytes) {
  // The sizes to allocate, in the order given: those that the kept blocks do not cover.
  std::vector<size_t> missing;
  uint64_t gen = 0;
  {
    std::vector<void*> unwanted;
    {
      std::lock_guard<std::mutex> lock(mu_);
      gen = ++generation_;
      expecting_ = true;
      expected_.clear();
      for (size_t bytes : sizes)
        if (bytes >= min_bytes_) ++expected_[bytes];
      take_unwanted_locked(unwanted);
      std::map<size_t, size_t> covered;
      for (size_t bytes : sizes)
        if (bytes >= min_bytes_ && ++covered[bytes] > kept_.count(bytes)) missing.push_back(bytes);
    }
    // Before allocating anything: what goes back lowers the peak that the new blocks raise.
    for (void* p : unwanted) base_.free(p);
  }
  // Whether a block of `bytes` is still wanted: expected requests of its size outnumber the
  // kept blocks and those other reserves are faulting in.
  auto wanted = [&](size_t bytes) {
    const auto e = expected_.find(bytes);
    return generation_ == gen && e != expected_.end() &&
           e->second > kept_.count(bytes) + in_flight_[bytes];
  };
  size_t added = 0;
  for (size_t bytes : missing) {
    if (bytes > max_new_bytes - added) continue;  // a smaller one later may still fit
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (generation_ != gen) break;  // a newer expectation (or a trim) replaced this one
      if (!wanted(bytes)) continue;   // requests of its size came first
      ++in_flight_[bytes];
    }
    void* p = nullptr;
    try {
      p = base_.allocate(bytes, Tag::kOther);
      fault_in(p, bytes);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      --in_flight_[bytes];
      landed_.notify_all();
      if (p) base_.free(p);
      throw;
    }
    std::unique_lock<std::mutex> lock(mu_);
    --in_flight_[bytes];
    const bool keep = wanted(bytes);
    if (keep) {
      kept_.emplace(bytes, p);
      bytes_kept_ += bytes;
      added += bytes;
      update_reserved_locked();
    }
    landed_.notify_all();
    if (keep) continue;
    lock.unlock();  // no longer expected (a newer expectation, a trim)
    base_.free(p);
  }
  return added;
}

void RecyclingAllocator::trim() {
  std::lock_guard<std::mutex> lock(mu_);
  trim_locked();
}

void RecyclingAllocator::trim_locked() {
  for (const auto& [bytes, p] : kept_) base_.free(p);
  kept_.clear();
  bytes_kept_ = 0;
  expecting_ = false;
  expected_.clear();
  ++generation_;
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
