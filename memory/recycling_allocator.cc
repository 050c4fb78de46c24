// RecyclingAllocator: exact-size reuse of large freed blocks until trim(), blocks faulted in
// ahead for the sizes a coming phase is expected to ask for, and freed blocks of other sizes
// reshaped into those.
#include "memory/recycling_allocator.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <tuple>

#include "base/check.h"
#include "base/log.h"
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

RecyclingAllocator::RecyclingAllocator(Allocator& base, size_t min_bytes, size_t spare_bytes)
    : base_(base), min_bytes_(min_bytes), spare_bytes_(std::max(min_bytes, spare_bytes)) {}

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
  std::pair<void*, size_t> spare{nullptr, 0};
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
    } else {
      spare = take_spare_locked(bytes);
    }
    if (expecting_)
      if (auto e = expected_.find(bytes); e != expected_.end() && e->second > 0) --e->second;
  }
  if (!p) {
    lock.unlock();  // the base may take a while (the system's allocator, a reshape)
    bool reshaped = false;
    if (spare.first) {
      std::tie(p, reshaped) = reshape_spare(spare.first, bytes, tag);
    } else {
      p = base_.allocate(bytes, tag);
    }
    lock.lock();
    if (reshaped) ++reused_, ++reshaped_;
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
  if (keep && expecting_)
    if (auto r = returning_.find(bytes); r != returning_.end() && r->second > 0) --r->second;
  if (keep && expecting_) {
    auto e = expected_.find(bytes);
    keep = (e != expected_.end() && e->second > kept_.count(bytes)) || keeps_spare_locked(bytes);
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

size_t RecyclingAllocator::wanted_of_locked(size_t bytes) const {
  if (!expecting_) return 0;
  const auto e = expected_.find(bytes);
  return e != expected_.end() ? e->second : 0;
}

void RecyclingAllocator::take_unwanted_locked(std::vector<void*>& out) {
  std::vector<std::pair<size_t, void*>> extra;  // beyond what their size is expected for
  for (auto it = kept_.begin(); it != kept_.end();) {
    const size_t bytes = it->first;
    const size_t want = wanted_of_locked(bytes), have = kept_.count(bytes);
    auto next = kept_.upper_bound(bytes);
    for (size_t drop = have > want ? have - want : 0; drop > 0; --drop) {
      auto victim = kept_.find(bytes);
      extra.emplace_back(bytes, victim->second);
      bytes_kept_ -= bytes;
      kept_.erase(victim);
    }
    it = next;
  }
  // The largest first: the fewest fresh pages for the sizes they become.
  std::sort(extra.begin(), extra.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [bytes, p] : extra) {
    if (keeps_spare_locked(bytes)) {
      kept_.emplace(bytes, p);
      bytes_kept_ += bytes;
    } else {
      out.push_back(p);
    }
  }
  stats_.bytes_reserved = stats_.bytes_live + bytes_kept_;
}

bool RecyclingAllocator::keeps_spare_locked(size_t bytes) const {
  if (!expecting_ || bytes < spare_bytes_) return false;
  size_t open = 0, open_bytes = 0;  // expected requests no block covers
  for (const auto& [size, want] : expected_) {
    if (size < spare_bytes_) continue;
    const auto f = in_flight_.find(size);
    const auto r = returning_.find(size);
    const size_t have = kept_.count(size) + (f != in_flight_.end() ? f->second : 0) +
                        (r != returning_.end() ? r->second : 0);
    if (want > have) open += want - have, open_bytes += (want - have) * size;
  }
  size_t spares = 0, spare_bytes = 0;
  for (auto it = kept_.begin(); it != kept_.end(); it = kept_.upper_bound(it->first)) {
    const size_t have = kept_.count(it->first), want = wanted_of_locked(it->first);
    if (have > want) spares += have - want, spare_bytes += (have - want) * it->first;
  }
  return spares < open && spare_bytes + bytes <= open_bytes;
}

std::pair<void*, size_t> RecyclingAllocator::take_spare_locked(size_t bytes) {
  if (!expecting_ || bytes < spare_bytes_) return {nullptr, 0};
  size_t best = 0;  // the smallest spare size of at least `bytes`, else the largest
  for (auto it = kept_.begin(); it != kept_.end(); it = kept_.upper_bound(it->first)) {
    const size_t size = it->first;
    if (size < spare_bytes_ || kept_.count(size) <= wanted_of_locked(size)) continue;
    const bool fits = size >= bytes, best_fits = best >= bytes;
    if (best == 0 || (fits && (!best_fits || size < best)) || (!fits && !best_fits && size > best))
      best = size;
  }
  if (best == 0) return {nullptr, 0};
  auto it = kept_.find(best);
  void* p = it->second;
  kept_.erase(it);
  bytes_kept_ -= best;
  stats_.bytes_reserved = stats_.bytes_live + bytes_kept_;
  return {p, best};
}

std::pair<void*, bool> RecyclingAllocator::reshape_spare(void* spare, size_t bytes, Tag tag) {
  if (void* p = base_.reshape(spare, bytes)) return {p, true};
  base_.free(spare);  // first: the new block replaces it
  return {base_.allocate(bytes, tag), false};
}

size_t RecyclingAllocator::reserve(const std::vector<size_t>& sizes, size_t max_new_bytes,
                                   const std::vector<size_t>& returning) {
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
      returning_.clear();
      for (size_t bytes : returning)
        if (bytes >= min_bytes_) ++returning_[bytes];
      take_unwanted_locked(unwanted);
      std::map<size_t, size_t> covered;
      for (size_t bytes : sizes)
        if (bytes >= min_bytes_ && ++covered[bytes] > kept_.count(bytes) + returning_[bytes])
          missing.push_back(bytes);
    }
    // Before allocating anything: what goes back lowers the peak that the new blocks raise.
    for (void* p : unwanted) base_.free(p);
    WEFT_DEBUG("memory", "reserve of ", sizes.size(), " sizes: ", missing.size(),
               " not covered by kept blocks; ", unwanted.size(), " kept blocks returned, ",
               bytes_kept() >> 20, " MiB kept (spares among them)");
  }
  // Whether a block of `bytes` is still wanted: expected requests of its size outnumber the
  // kept blocks and those other reserves are faulting in.
  auto wanted = [&](size_t bytes) {
    const auto e = expected_.find(bytes);
    return generation_ == gen && e != expected_.end() &&
           e->second > kept_.count(bytes) + in_flight_[bytes] + returning_[bytes];
  };
  size_t added = 0, resident = 0, fresh = 0;
  // Two passes: a size that a spare could serve but none does yet waits for the second, so
  // that spares freed meanwhile (a survivor dropping the state it goes back from) serve it
  // instead of fresh pages; the sizes no spare can serve come first.
  std::vector<size_t> later;
  const size_t first_pass = missing.size();
  for (size_t i = 0; i < first_pass + later.size(); ++i) {
    const bool first = i < first_pass;
    const size_t bytes = first ? missing[i] : later[i - first_pass];
    if (bytes > max_new_bytes - added) continue;  // a smaller one later may still fit
    std::pair<void*, size_t> spare{nullptr, 0};
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (generation_ != gen) break;  // a newer expectation (or a trim) replaced this one
      if (!wanted(bytes)) continue;   // requests of its size came first
      spare = take_spare_locked(bytes);
      if (!spare.first && first && bytes >= spare_bytes_) {
        later.push_back(bytes);
        continue;
      }
      ++in_flight_[bytes];
    }
    void* p = nullptr;
    try {
      bool reshaped = false;
      if (spare.first) {
        std::tie(p, reshaped) = reshape_spare(spare.first, bytes, Tag::kOther);
      } else {
        p = base_.allocate(bytes, Tag::kOther);
      }
      // A reshaped spare's pages up to its old size are resident already.
      const size_t have = reshaped ? std::min(spare.second, bytes) : 0;
      if (bytes > have) fault_in(static_cast<char*>(p) + have, bytes - have);
      resident += have;
      fresh += bytes - have;
      if (reshaped) {
        std::lock_guard<std::mutex> lock(mu_);
        ++reshaped_;
      }
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
  WEFT_DEBUG("memory", "reserve: ", added >> 20, " MiB kept for the expected sizes, ",
             resident >> 20, " MiB of them pages that existed (spares), ", fresh >> 20,
             " MiB faulted in anew");
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
  returning_.clear();
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

size_t RecyclingAllocator::reshaped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reshaped_;
}

}  // namespace weft::memory
