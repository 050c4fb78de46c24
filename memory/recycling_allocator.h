// An allocator that keeps the large blocks freed to it for later requests of the same size
// instead of returning them to the system, and that faults in ahead the blocks a coming phase
// is expected to ask for. An online resize drops one trainer and builds the next in the same
// process; for a data-parallel change the new trainer's gradient accumulators have the very
// sizes of the last one's, and taking those blocks back skips the page faults of fresh memory
// (0.25 s of a resize for 400 MB of gradients on the bench host). For a change of layout the
// state router's destinations are new sizes: reserve() faults them in while the process waits
// for the membership, so that the move writes into pages that exist (a copy into touched
// memory runs at memcpy speed, 18 GB/s on the bench host; into fresh memory at 2 GB/s).
#pragma once

#include <condition_variable>
#include <cstdint>
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
  // left), else a new block from `base`. Without an expectation (reserve), a request of at
  // least min_bytes that finds none returns every kept block to `base` first: kept blocks
  // beside a new allocation would raise the peak above what it was without this allocator.
  // With one, every kept block is one that an expected request will take, so none goes back;
  // the request counts against the expectation of its size, and one whose size a reserve is
  // faulting in right now waits for that block (it would fault as many pages itself) rather
  // than allocating another. Thread-safe.
  void* allocate(size_t bytes, Tag tag = Tag::kOther) override;
  // Without an expectation: keeps a block of at least min_bytes, returns a smaller one to
  // `base`. With one: keeps it only while expected requests of its size outnumber the kept
  // blocks of that size (a source the router frees during a move goes back to the system at
  // once unless the new layout asks for its size), else returns it. InternalError for a
  // pointer this allocator did not hand out. Thread-safe.
  void free(void* ptr) override;
  // bytes_live: handed out; bytes_reserved: handed out plus kept.
  AllocatorStats stats() const override;
  std::string name() const override { return "recycling"; }

  // Expects requests of `sizes` bytes (sizes below min_bytes are ignored), replacing any
  // earlier expectation: returns to `base` at once the kept blocks that no expected request
  // takes, then allocates from `base` a block for each expected size that no kept block
  // covers, in the order given, while what it allocates stays within `max_new_bytes` (0: it
  // only sets the expectation and trims), writing each page of it (the system faults them in
  // now; MADV_POPULATE_WRITE where the kernel has it) and keeping it. Its contents are
  // unspecified. A process that will need that memory and waits for something else (a
  // newcomer of an online resize while the world forms; a survivor while the membership is
  // agreed) calls it from a thread of its own, so that the state it receives lands in pages
  // that exist. Requests may come meanwhile, from other threads: a size it has faulted in is
  // served from its block, the one it is faulting waits for it, and one it has not reached
  // yet is allocated from `base` and no longer reserved (the faults split between the
  // threads). Before each block it skips sizes no longer expected; a later call, or trim(),
  // stops it after its current block. Returns the bytes it allocated and kept. Thread-safe.
  size_t reserve(const std::vector<size_t>& sizes, size_t max_new_bytes = SIZE_MAX);
  // Returns every kept block to `base` and drops the expectation. Thread-safe.
  void trim();
  size_t bytes_kept() const;
  // Allocations served from a kept block so far.
  size_t reused() const;

 private:
  // The kept blocks beyond what the expectation wants of their size (all of them without an
  // expectation): moved to `out` for the caller to free outside the lock.
  void take_unwanted_locked(std::vector<void*>& out);
  void trim_locked();
  void update_reserved_locked();

  Allocator& base_;
  const size_t min_bytes_;
  mutable std::mutex mu_;
  std::unordered_map<void*, size_t> live_;  // handed out -> requested bytes
  std::multimap<size_t, void*> kept_;       // requested bytes -> block
  size_t bytes_kept_ = 0, reused_ = 0;
  // The expected requests by size (reserve), while `expecting_`; a call to reserve or
  // trim bumps `generation_`, which stops a reserve in progress.
  bool expecting_ = false;
  std::map<size_t, size_t> expected_;
  std::map<size_t, size_t> in_flight_;  // blocks a reserve is faulting in, by size
  std::condition_variable landed_;      // a block in flight was kept or dropped
  uint64_t generation_ = 0;
  AllocatorStats stats_;
};

}  // namespace weft::memory
