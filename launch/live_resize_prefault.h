// The destinations of an online resize, faulted in before the move writes them. A copy into
// fresh pages runs at a tenth of memcpy on the bench host (a page fault and the kernel's
// zeroing per 4 KiB page: 604 MiB in 275 ms, against 34 ms into touched memory), so a rank
// faults in the blocks its next layout allocates (persistent tensors: the router's
// destinations and the trainer's gradients) on a thread of its own while it waits for
// something else: a newcomer while the world forms, a survivor from the moment a change is
// known (a graceful leave's or a join's notice, beside the old world's last step; a failure,
// while the membership is agreed),
// for the world it expects (the notice's when there is one, else the nearest likely one; a
// different outcome re-targets the reserve, which trims what the new sizes do not want).
// One mechanism, memory::RecyclingAllocator::reserve, for both. Allocations may come while it
// runs (a block it has faulted in serves its size, the one it is faulting is waited for, the
// sizes it has not reached are faulted by their writers), but the entry waits for it before
// building the trainer: the router faulting beside it on the same cores measured slower.
#pragma once

#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "launch/live_resize.h"
#include "memory/recycling_allocator.h"
#include "planner/planner.h"

namespace weft::launch {

// The bytes of every persistent tensor (state roots, gradient accumulators) that rank `rank`
// of `plan` allocates: what its trainer and the router's destinations ask for.
std::vector<size_t> persistent_sizes(const planner::Plan& plan, int rank);

// What rank `rank` of `plan` will allocate when it enters that world holding `held` (its live
// state): persistent_sizes less, size for size, the tensors it holds, which the router adopts
// where the two layouts agree (a survivor of a data-parallel change adopts all of them). By
// size only: the router decides box by box, so a held tensor that happens to have the size of
// a new one that it does not become leaves that one unreserved (faulted during the move, as
// without a reserve).
std::vector<size_t> sizes_to_fault(const planner::Plan& plan, int rank, const HeldState& held);
// The same from the bytes of each held tensor: a world that still trains knows its state's
// sizes (held_sizes of hold_state at its start), not yet its HeldState.
std::vector<size_t> sizes_to_fault(const planner::Plan& plan, int rank,
                                   const std::vector<size_t>& held);
// The bytes of each tensor `held` holds (none when it is not valid).
std::vector<size_t> held_sizes(const HeldState& held);

// What a rank holding `held_bytes` may fault in ahead for `sizes` without raising its peak
// past the move's bound (parallel::RankMemory::bound: the larger of the old and new
// holdings plus the router's budget), counting the sizes as the new holding: that bound less
// what it holds. The old state is held until the router frees it, so faulting in all of a
// larger new layout beside it would hold both.
size_t prefault_bound(int64_t held_bytes, const std::vector<size_t>& sizes, int64_t budget_bytes);
// The same for a rank that holds `holding_bytes` now, `held_bytes` of them its state and the
// rest blocks it frees before the move (a training rank's gradients at a notice): that bound
// less all it holds, so that what it faults in beside its step keeps within the move's bound.
size_t prefault_bound(int64_t held_bytes, const std::vector<size_t>& sizes, int64_t budget_bytes,
                      int64_t holding_bytes);

// One reserve at a time on a thread of its own, over `persistent`'s blocks.
class DestinationPrefault {
 public:
  explicit DestinationPrefault(memory::RecyclingAllocator& persistent) : persistent_(persistent) {}
  // Stops one in progress (after its current block) and joins it.
  ~DestinationPrefault();
  DestinationPrefault(const DestinationPrefault&) = delete;
  DestinationPrefault& operator=(const DestinationPrefault&) = delete;

  // Faults in `sizes` within `max_bytes` (RecyclingAllocator::reserve) on a thread of its
  // own, unless the last call was for the same sizes: that one goes on, or is done, and a
  // larger `max_bytes` lets it fault up to that in all (a graceful leave's reserve starts at
  // its notice within what the training rank may add beside its gradients, and goes on at
  // the step boundary, where those are freed, within the move's bound). One for other sizes
  // is stopped first; the new reserve trims the blocks that `sizes` does not want.
  // `returning`: the sizes of blocks the rank frees before the move that the next layout
  // takes back (RecyclingAllocator::reserve), faulted in by nobody.
  void start(std::vector<size_t> sizes, size_t max_bytes, std::vector<size_t> returning = {});
  // Expects `sizes` without faulting anything in (a guess that missed, on the critical path
  // now: the router faults its destinations as it writes them), unless the last call was
  // for the same sizes; stops and joins one in progress for other sizes.
  void expect(std::vector<size_t> sizes);
  // Waits for the one in progress; the bytes it faulted in since the last wait (0 when none
  // ran).
  size_t wait();
  // Stops one in progress and returns every kept block (RecyclingAllocator::trim): the
  // world is entered, and a later start() for the same sizes faults them in again. Returns
  // what the last reserve faulted in and kept (its blocks served requests, or were trimmed).
  size_t trim();
  // Whether a reserve is in progress or done and not yet waited for.
  bool started() const { return thread_.joinable(); }

  // The bound the current sizes' reserve runs under (0: none started for them).
  size_t max_bytes() const;

 private:
  void stop();
  // The thread: reserves for sizes_ until it has run under the latest max_.
  void launch();

  memory::RecyclingAllocator& persistent_;
  std::vector<size_t> sizes_;
  std::vector<size_t> returning_;  // for the first pass only: freed and kept by the next ones
  bool has_sizes_ = false;
  mutable std::mutex mu_;
  size_t max_ = 0;        // the bound for sizes_, raised by start() while the thread runs
  size_t ran_under_ = 0;  // the bound of the thread's last pass (guarded by mu_)
  bool running_ = false;  // the thread has not yet seen max_ == ran_under_ (guarded by mu_)
  size_t faulted_ = 0;    // for sizes_ in all; written by the thread, read after join
  size_t reported_ = 0;   // of faulted_, returned by wait() already
  std::thread thread_;
};

}  // namespace weft::launch
