// PlannedAllocator: serves a step's allocations at the offsets an offline plan gave them,
// and what the plan did not foresee online, in the arena's idle ranges or a fallback pool.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "memory/caching_allocator.h"
#include "memory/free_space.h"
#include "memory/offline_planner.h"
#include "memory/pointer_map.h"
#include "memory/segment_source.h"

namespace weft::memory {

struct PlannedOptions {
  PlannerOptions planner;   // how the constructor and replan(trace) plan a trace
  size_t match_behind = 4;  // how far the matcher looks behind and ahead of the expected
  size_t match_ahead = 16;  //   allocation for one of the same size and tag
  // The pool for what fits nowhere in the arena: a *small* caching pool (256 KiB segments
  // for requests up to 64 KiB, exact segments above), since what lands here is the few
  // blocks a step leaves live (inputs, kept scalars) plus the unforeseen; PyTorch's 2 MiB /
  // 20 MiB segments cost more than the plan saves on small models (measured: a dp2 ZeRO-3
  // trace held 2 MiB for 76 small blocks).
  CachingOptions fallback = small_pool_options();
  static CachingOptions small_pool_options() {
    CachingOptions o;
    o.small_size = 64 << 10;
    o.small_segment = 256 << 10;
    o.large_segment = 0;  // below min_large_alloc: a segment of exactly the rounded request
    o.round_large = 64 << 10;
    return o;
  }
};

struct PlannedStats {
  size_t planned = 0;  // served as planned (at their offset, or in their group)
  size_t grouped = 0;  // unforeseen, but absorbed by their lifetime group's region
  size_t online = 0;   // served best-fit in arena ranges the plan leaves idle
  uint64_t online_bytes = 0;
  size_t fallback = 0;  // served by the fallback pool
  uint64_t fallback_bytes = 0;
  size_t unplanned = 0;   // of the fallback ones: records the plan left out on purpose
  size_t mismatches = 0;  // requests that matched no planned record by size and tag
  size_t conflicts = 0;   // matched, but the planned range was still occupied
  size_t replans = 0;
  uint64_t arena_bytes = 0;
  uint64_t retired_arena_bytes = 0;  // earlier arenas kept until their last block is freed
};

// How a request finds its place:
// - The k-th allocation after begin_step() is expected to be record k of the planned
//   trace. When that record has the request's tag and a block size no smaller, the
//   request takes its range (if the range is free now). When the tag is the same but the
//   request is larger (MoE routing changed a size), it stands in for that record with a
//   new size and the expectation moves on. When the tag differs, the allocation sequence
//   has shifted (an extra allocation, or one the plan expected never came): the nearest
//   unused record within match_behind / match_ahead with the same block size and tag is
//   taken, and the expectation moves past it.
// - If the executor marks phases with set_phase() as it did while the trace was recorded,
//   the first allocation of each span restarts the expectation at that span's first
//   record, so a difference in one span does not shift the ones after it.
// - Blocks of a lifetime group (see PlanGroup) are laid out back to back in their group's
//   region in the order they come, so a group whose members change sizes but not their
//   sum (the experts of an MoE layer: the routed tokens add up the same) still fits. A
//   request standing in for a group member with a new size goes there too, if it fits.
// - A request no record takes is placed best-fit in the arena ranges that no planned block
//   still to come claims during the lifetime of the expected record (STWeaver's spare
//   windows) and no live block holds. So is a matched request whose planned range is still
//   occupied (a block lived longer than planned). What fits nowhere in the arena goes to a
//   fallback CachingAllocator, as do records the plan left out (live at the end of the
//   traced step).
// - No two live blocks ever overlap, whatever the requests: every arena placement is
//   checked against the live ranges; a wrong plan costs memory, never correctness.
// The allocation order drives matching, so the plan is only as good as that order is
// reproducible: an executor that allocates from several threads at once loses hits,
// not safety. Thread-safe (one mutex).
class PlannedAllocator final : public Allocator {
 public:
  // Plans `trace` and reserves the arena from `arena_source`; the fallback pool takes its
  // segments from `fallback_source`. nullptr sources mean default_host_segment_source();
  // given sources must outlive the allocator. Throws std::bad_alloc when the arena cannot
  // be reserved and InternalError for an inconsistent trace.
  explicit PlannedAllocator(const Trace& trace, PlannedOptions options = {},
                            SegmentSource* arena_source = nullptr,
                            SegmentSource* fallback_source = nullptr);
  // Uses a plan made earlier for this trace; InternalError when check_plan() rejects it.
  PlannedAllocator(const Trace& trace, Plan plan, PlannedOptions options = {},
                   SegmentSource* arena_source = nullptr, SegmentSource* fallback_source = nullptr);
  ~PlannedAllocator() override;
  PlannedAllocator(const PlannedAllocator&) = delete;
  PlannedAllocator& operator=(const PlannedAllocator&) = delete;

  void* allocate(size_t bytes, Tag tag = Tag::kOther) override;
  void free(void* ptr) override;
  // bytes_reserved counts the arena, retired arenas and the fallback pool's segments.
  AllocatorStats stats() const override;
  std::string name() const override { return "planned"; }
  // Restarts matching at record 0 of the plan.
  void begin_step() override;
  // Counts spans as TraceBuilder does, to restart matching at each span's first record.
  void set_phase(Phase phase, int micro_batch = -1) override;

  // A new plan for a new trace (the job's layout changed). Blocks live in the old arena
  // stay valid; that arena is released when the last of them is freed. The new arena is
  // reserved before anything changes, so a std::bad_alloc leaves the old plan in force.
  void replan(const Trace& trace);
  void replan(const Trace& trace, Plan plan);

  // The plan in force; the reference is invalidated by replan().
  const Plan& plan() const { return plan_; }
  PlannedStats planned_stats() const;
  // Returns the fallback pool's unused segments to its source.
  void empty_cache();

 private:
  struct Slot {
    uint64_t offset;  // Plan::kUnplanned: served by the fallback pool
    uint64_t size;
    int64_t s, e;  // lifetime in the trace's event time
    Tag tag;
    int32_t group;  // index into groups_, or -1
  };
  struct Group {
    uint64_t offset, bytes;
    uint64_t used = 0;  // bytes handed out from the region's start in step `step`
    uint64_t step = 0;
  };
  struct Arena {
    char* base = nullptr;
    uint64_t bytes = 0;  // as reserved (the plan's arena rounded to the segment alignment)
    size_t live = 0;
  };
  enum class Where : uint8_t { kArena, kRetired, kFallback };
  struct Block {
    Where where;
    uint32_t arena;   // id in retired_ when kRetired
    uint64_t offset;  // in the current arena when kArena
    uint64_t size;
    size_t requested;
  };
  using Ranges = FreeSpace::Ranges;
  static constexpr size_t kNone = SIZE_MAX;

  void install(const Trace& trace, Plan plan);  // callers hold mu_ or are constructing
  Arena reserve_arena(uint64_t bytes);
  struct Match {
    size_t slot;          // the record taken, or kNone
    size_t window;        // whose lifetime an online placement should assume (kNone: none)
    bool own_range_free;  // the window's record will not come: its range is free too
  };
  Match match(uint64_t size, Tag tag);
  const Ranges& spare(size_t window, bool own_range_free);
  uint64_t place_online(uint64_t size, size_t window, bool own_range_free);
  uint64_t place_in_group(int32_t group, uint64_t size);
  void* from_arena(uint64_t offset, uint64_t size, size_t requested);
  void note_reserved();

  PlannedOptions options_;
  SegmentSource* arena_source_;
  mutable std::mutex mu_;
  Plan plan_;
  std::vector<Slot> slots_;
  std::vector<Group> groups_;
  std::vector<uint64_t> used_in_step_;  // step id at which each slot was last taken
  uint64_t step_ = 1;
  size_t cursor_ = 0;               // the record the next allocation is expected to be
  std::vector<size_t> span_first_;  // first record allocated in span >= s; empty: no spans
  int32_t span_ = 0;  // the step's current span, numbered as TraceBuilder numbers them
  bool span_used_ = false;
  bool span_jump_ = false;  // the next allocation restarts matching at span_first_[span_]
  Arena arena_;
  FreeSpace free_;  // the current arena's free ranges
  std::map<uint32_t, Arena> retired_;
  uint32_t next_retired_id_ = 0;
  PointerMap<Block> blocks_;
  std::unordered_map<size_t, Ranges> spare_cache_;  // per window key, built on first use
  CachingAllocator fallback_;
  uint64_t fallback_reserved_ = 0;
  AllocatorStats stats_;
  PlannedStats planned_stats_;
};

}  // namespace weft::memory
