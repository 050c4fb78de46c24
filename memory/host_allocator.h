// A plain aligned host allocator with statistics: the simplest Allocator, and the
// default for tensors that no arena owns.
//
// The default one (default_host_allocator) also keeps large freed blocks for later requests
// of the same size. A training step allocates and frees the same large blocks every step
// (collective staging, gathered ZeRO-3 weights, received shards), and glibc maps every block
// over 32 MiB anew and unmaps it on free: on this project's VMs a ZeRO-3 step of 162M
// parameters over 3 ranks spent 43% of its CPU time faulting in and clearing fresh pages,
// and keeping blocks took its steps from 8.7-9.9 s to 6.4-7.9 s (two A/B runs). Kept blocks
// never make the footprint (live plus kept) exceed the most that was ever live, and never
// exceed 1/32 of the machine's memory: several workers of a node, each holding its own peak
// for good, plus their snapshot slots, ran a 24 GB machine out of memory (a 354M job at
// two ranks with snapshot.every 1). Blocks of 32 MiB and more are in transparent huge pages
// (memory/huge_pages.h).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>

#include "memory/allocator.h"

namespace weft::memory {

class HostAllocator final : public Allocator {
 public:
  // Blocks of at least kKeepBytes are kept when freed if `keep_freed`.
  static constexpr size_t kKeepBytes = size_t(1) << 20;
  // At most `keep_cap` bytes are kept (0: 1/32 of the machine's physical memory).
  explicit HostAllocator(bool keep_freed = false, size_t keep_cap = 0);
  ~HostAllocator() override;  // frees the kept blocks
  HostAllocator(const HostAllocator&) = delete;
  HostAllocator& operator=(const HostAllocator&) = delete;

  // A kept block of the same rounded size when there is one (its bytes are what its last
  // user left, as with any fresh allocation: unspecified), else a new one; kept blocks are
  // returned to the system first, oldest first, as far as the new block would otherwise
  // raise the footprint above the live peak.
  void* allocate(size_t bytes, Tag tag = Tag::kOther) override;
  void free(void* ptr) override;
  // Where both sizes are at least kHugeMinBytes (reshape_host_block); InternalError for a
  // pointer it did not allocate.
  void* reshape(void* p, size_t bytes) override;
  // bytes_reserved: live blocks (rounded) plus kept ones.
  AllocatorStats stats() const override;
  std::string name() const override { return "host"; }

  // Returns every kept block to the system.
  void trim();
  size_t bytes_kept() const;
  size_t reused() const;  // allocations served from a kept block so far

 private:
  void release_kept_locked(size_t want_free);

  const bool keep_freed_;
  const size_t keep_cap_;
  mutable std::mutex mu_;
  std::unordered_map<void*, size_t> sizes_;
  AllocatorStats stats_;
  size_t rounded_live_ = 0, rounded_live_peak_ = 0, kept_bytes_ = 0, reused_ = 0;
  uint64_t next_age_ = 0;
  std::multimap<size_t, uint64_t> kept_by_size_;       // rounded size -> age
  std::map<uint64_t, std::pair<size_t, void*>> kept_;  // age (oldest first) -> block
};

}  // namespace weft::memory
