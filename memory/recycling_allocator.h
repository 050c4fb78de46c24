// An allocator that keeps the large blocks freed to it for later requests of the same size
// instead of returning them to the system. An online resize drops one trainer and builds the
// next in the same process; for a data-parallel change the new trainer's gradient
// accumulators have the very sizes of the last one's, and taking those blocks back skips the
// page faults of fresh memory (0.25 s of a resize for 400 MB of gradients on the bench host).
#pragma once

#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "memory/allocator.h"

namespace weft::memory {

class RecyclingAllocator final : public Allocator {
 public:
  // Blocks of at least `min_bytes` are kept when freed; smaller ones go back to `base` at
  // once. `base` must outlive this allocator.
  explicit RecyclingAllocator(Allocator& base = default_host_allocator(),
                              size_t min_bytes = size_t(1) << 20);
  // Returns the kept blocks to `base`. Every block handed out must have been freed.
  ~RecyclingAllocator() override;
  RecyclingAllocator(const RecyclingAllocator&) = delete;
  RecyclingAllocator& operator=(const RecyclingAllocator&) = delete;

  // A kept block of exactly `bytes` when there is one (its contents are what its last user
  // left), else a new block from `base`. A request of at least min_bytes that finds none
  // returns every kept block to `base` first: kept blocks beside a new allocation would
  // raise the peak above what it was without this allocator. Thread-safe.
  void* allocate(size_t bytes, Tag tag = Tag::kOther) override;
  // Keeps a block of at least min_bytes, returns a smaller one to `base`. InternalError for
  // a pointer this allocator did not hand out. Thread-safe.
  void free(void* ptr) override;
  // bytes_live: handed out; bytes_reserved: handed out plus kept.
  AllocatorStats stats() const override;
  std::string name() const override { return "recycling"; }

  // Allocates a block of each of `sizes` bytes from `base` (less the blocks of those sizes
  // already kept), writes one byte of each of its pages (the system faults them in now) and
  // keeps it for a later request of its size; its contents are unspecified. A process that will
  // need that memory and is waiting for something else (a newcomer of an online resize,
  // waiting for the survivors to finish their step) calls it from a thread of its own, so
  // that the state it receives lands in pages that exist. Sizes below min_bytes are
  // skipped. Thread-safe.
  void reserve(const std::vector<size_t>& sizes);
  // Returns every kept block to `base`. Thread-safe.
  void trim();
  size_t bytes_kept() const;
  // Allocations served from a kept block so far.
  size_t reused() const;

 private:
  void trim_locked();

  Allocator& base_;
  const size_t min_bytes_;
  mutable std::mutex mu_;
  std::unordered_map<void*, size_t> live_;  // handed out -> requested bytes
  std::multimap<size_t, void*> kept_;       // requested bytes -> block
  size_t bytes_kept_ = 0, reused_ = 0;
  AllocatorStats stats_;
};

}  // namespace weft::memory
