// An allocator that keeps the large blocks freed to it for later requests of the same size
// instead of returning them to the system, and that faults in ahead the blocks a coming phase
// is expected to ask for. An online resize drops one trainer and builds the next in the same
// process; for a data-parallel change the new trainer's gradient accumulators have the very
// sizes of the last one's, and taking those blocks back skips the page faults of fresh memory
// (0.25 s of a resize for 400 MB of gradients on the bench host). For a change of layout the
// state router's destinations are new sizes: reserve() faults them in while the process waits
// for the membership, so that the move writes into pages that exist (a copy into touched
// memory runs at memcpy speed, 18 GB/s on the bench host; into fresh memory at 2 GB/s).
// The blocks the last layout frees (its gradients when its trainer goes, a state the world
// goes back from) have the last layout's sizes, not the new one's: under an expectation such
// a block is kept as a spare for an expected size nothing covers yet, and reshaped into it
// (Allocator::reshape: its pages stay, only the difference is fresh) instead of going back
// while that size is faulted in anew.
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
  // once. Blocks of at least `spare_bytes` may be kept as spares under an expectation (see
  // free) and reshaped by `base` (Allocator::reshape; by default the size from which the host
  // allocator maps a block of its own). `base` must outlive this allocator.
  explicit RecyclingAllocator(Allocator& base = default_host_allocator(),
                              size_t min_bytes = size_t(1) << 20,
                              size_t spare_bytes = size_t(32) << 20);
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
  // than allocating another, and one that finds no block of its size takes a spare (free)
  // reshaped to it when there is one. Thread-safe.
  void* allocate(size_t bytes, Tag tag = Tag::kOther) override;
  // Without an expectation: keeps a block of at least min_bytes, returns a smaller one to
  // `base`. With one: keeps it only while expected requests of its size outnumber the kept
  // blocks of that size (a source the router frees during a move goes back to the system at
  // once unless the new layout asks for its size), else keeps it as a spare when it is at
  // least spare_bytes and the expected sizes of at least spare_bytes that no block covers
  // (kept, or being faulted in) outnumber the spares and their bytes are at least the spares'
  // with it: the spares never hold more than those requests will allocate anyway, so the
  // peak is what it was; else returns it. InternalError for a pointer this allocator did not
  // hand out. Thread-safe.
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
  // unspecified. Kept blocks no expected request takes are kept as spares as free() would
  // keep them (the largest first), the rest returned; a missing size takes a spare when there
  // is one (the smallest at least its size, else the largest), reshaped and its added pages
  // faulted in, counted in full against max_new_bytes. A size of at least spare_bytes that
  // finds no spare at its turn is taken after the others, in a second pass, so that spares
  // freed meanwhile can serve it. A process that will need that memory and waits for something else
  // (a newcomer of an online resize while the world forms; a survivor while the membership is
  // agreed) calls it from a thread of its own, so that the state it receives lands in pages
  // that exist. Requests may come meanwhile, from other threads: a size it has faulted in is
  // served from its block, the one it is faulting waits for it, and one it has not reached
  // yet is allocated from `base` and no longer reserved (the faults split between the
  // threads). Before each block it skips sizes no longer expected; a later call, or trim(),
  // stops it after its current block. Returns the bytes it allocated and kept. Thread-safe.
  // `returning`: sizes of blocks handed out that the caller frees before the expected requests
  // come (a trainer's gradients, when the reserve starts beside its last step): each covers
  // an expected request of its size as a kept block would, so that size is not faulted in
  // anew beside it, and is kept for it when freed.
  size_t reserve(const std::vector<size_t>& sizes, size_t max_new_bytes = SIZE_MAX,
                 const std::vector<size_t>& returning = {});
  // Returns every kept block to `base` and drops the expectation. Thread-safe.
  void trim();
  size_t bytes_kept() const;
  // Allocations served from a kept block so far (reshaped spares included).
  size_t reused() const;
  // Spares reshaped to another size so far.
  size_t reshaped() const;

 private:
  // The kept blocks beyond what the expectation wants of their size (all of them without an
  // expectation), less the spares it keeps: moved to `out` for the caller to free outside the
  // lock.
  void take_unwanted_locked(std::vector<void*>& out);
  // Whether a block of `bytes` that no expected request of its size wants is kept as a spare.
  bool keeps_spare_locked(size_t bytes) const;
  // A spare for a request of `bytes` (the smallest at least that, else the largest), taken out
  // of kept_, with its size; {nullptr, 0} when there is none.
  std::pair<void*, size_t> take_spare_locked(size_t bytes);
  // `spare` (out of kept_) made a block of `bytes` by the base, or the base's new block when
  // it cannot reshape; with whether it is the spare reshaped. Outside the lock.
  std::pair<void*, bool> reshape_spare(void* spare, size_t bytes, Tag tag);
  // What the expectation wants of `bytes` (0 without one).
  size_t wanted_of_locked(size_t bytes) const;
  void trim_locked();
  void update_reserved_locked();

  Allocator& base_;
  const size_t min_bytes_, spare_bytes_;
  mutable std::mutex mu_;
  std::unordered_map<void*, size_t> live_;  // handed out -> requested bytes
  std::multimap<size_t, void*> kept_;       // requested bytes -> block
  size_t bytes_kept_ = 0, reused_ = 0, reshaped_ = 0;
  // The expected requests by size (reserve), while `expecting_`; a call to reserve or
  // trim bumps `generation_`, which stops a reserve in progress.
  bool expecting_ = false;
  std::map<size_t, size_t> expected_;
  std::map<size_t, size_t> in_flight_;  // blocks a reserve is faulting in, by size
  std::map<size_t, size_t> returning_;  // handed-out blocks that will cover expected sizes
  std::condition_variable landed_;      // a block in flight was kept or dropped
  uint64_t generation_ = 0;
  AllocatorStats stats_;
};

}  // namespace weft::memory
