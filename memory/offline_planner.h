// Offline planner: offsets in one arena for a step's allocations, from its trace (the
// dynamic storage allocation problem; STWeaver's grouping plus best-of greedy orderings).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memory/trace.h"

namespace weft::memory {

struct PlannerOptions {
  uint64_t alignment = 512;   // offsets and block sizes; a power of two >= Allocator::kAlignment
  bool plan_unfreed = false;  // records the step leaves live: false leaves them unplanned
                              // (STWeaver's "unreleased": they cross steps irregularly)
  bool try_grouping = true;   // also try STWeaver's lifetime groups as packing units
  // Dissolve a group whose region is emptier than this while held whole. Lower than
  // STWeaver's 0.7 because a group here holds its region whole only while it grows.
  double group_min_utilization = 0.25;
  size_t group_min_members = 2;
  // A grouped candidate wins when its arena is within this fraction of the best one:
  // a group's region absorbs changes in its members' sizes at run time (MoE experts).
  double group_slack = 0.005;
};

// A lifetime group of the plan: blocks allocated in one span and freed in a later one.
// They are all live at once when their allocating span ends, so the group is laid out
// as one region, members back to back in allocation order, that no other planned block
// touches from the group's first allocation to its first free; after that, other blocks
// may use what each freed member leaves.
struct PlanGroup {
  uint64_t offset = 0;
  uint64_t bytes = 0;      // the sum of the members' block sizes
  int64_t s = 0, e = 0;    // first allocation, last free (event time)
  int64_t first_free = 0;  // the region is the group's alone during [s, first_free)
};

struct PlanCandidate {
  std::string strategy;  // "size", "lifetime", "area", "group+size", ...
  uint64_t arena_bytes = 0;
};

// Offsets for every record of one trace. A record's block is [offsets[k], offsets[k] +
// sizes[k]) in the arena during [alloc_event, end_of) of the trace.
struct Plan {
  static constexpr uint64_t kUnplanned = UINT64_MAX;
  uint64_t alignment = 512;
  uint64_t arena_bytes = 0;
  uint64_t lower_bound = 0;               // peak over time of the live bytes of planned blocks
  std::vector<uint64_t> offsets;          // one per trace record; kUnplanned: served elsewhere
  std::vector<uint64_t> sizes;            // block_size(record.size, alignment)
  std::string strategy;                   // the candidate that won
  std::vector<PlanCandidate> candidates;  // every candidate tried, in order
  size_t num_groups = 0;                  // lifetime groups kept by the grouped candidates
  std::vector<PlanGroup> groups;          // the winner's groups; empty when a flat candidate won
  std::vector<int32_t> group_of;          // per record: index into groups, or -1
  bool planned(size_t k) const { return offsets[k] != kUnplanned; }
};

// Plans `trace` (which must be consistent: trace_error() empty, else InternalError).
// Each candidate places its units one at a time in the candidate's order (by size, by
// lifetime, by size x lifetime; all descending), best-fit: among the address gaps left by
// placed units whose lifetimes overlap the unit's, the smallest that fits (lowest
// address on ties), else on top of them. Units are single blocks, or, in the grouped
// candidates, PlanGroups (a group whose region is less than group_min_utilization full
// while it is held whole is dissolved into single blocks). The smallest arena wins (see
// group_slack); the search stops early when a candidate reaches the lower bound.
// Deterministic; cost about O(n * live * log live).
Plan plan_offline(const Trace& trace, const PlannerOptions& options = {});

struct PlanCheck {
  bool ok = true;
  std::string message;  // the first violation found
  explicit operator bool() const { return ok; }
};

// Checks a plan against its trace: one offset and size per record, sizes cover the
// requests, offsets aligned, blocks inside the arena, no two planned blocks whose
// lifetimes overlap share an address, and each group holds its members and no other
// block while it is held whole. O(n log n).
PlanCheck check_plan(const Trace& trace, const Plan& plan);

}  // namespace weft::memory
