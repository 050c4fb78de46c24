// Side-by-side replay of training-step traces through the caching allocator (PyTorch's
// design) and through the offline plan + planned allocator: the numbers behind
// `weft bench memory` and bench_memory. Step 0 is planned; every step is replayed.
#pragma once

#include <string>
#include <vector>

#include "memory/planned_allocator.h"
#include "memory/trace.h"

namespace weft::memory {

// One trace's comparison. lb: peak live bytes (the bound of any allocator); reserved: peak
// bytes held from the system; ns: wall time per allocate or free in the warm replays
// (fastest of 5 passes); hit: share of requests served at their planned place.
struct ComparisonRow {
  std::string name;
  size_t allocs = 0;
  uint64_t lb = 0, caching_reserved = 0, planned_reserved = 0;
  double plan_ratio = 0, plan_ms = 0, caching_ns = 0, planned_ns = 0, hit = 0;
  uint64_t fallback_bytes = 0;
  std::string strategy;
  PlannedStats ps;
};

// Plans steps[0], replays every step through both allocators. Throws InternalError if the
// two replays disagree on the live peak (a replay bug).
ComparisonRow compare_allocators(const std::string& name, const std::vector<Trace>& steps);
// The table: LB, reserved and fragmentation (1 - live/reserved) of each allocator, the
// reduction of fragmentation, plan/LB, planning ms, ns per call, hit rate; then the mean
// reduction. `csv` prints machine-readable rows instead.
void print_comparison(const std::vector<ComparisonRow>& rows, bool csv = false);
// How the planned allocator served the requests (planned / group / online / fallback).
void print_serving_details(const std::vector<ComparisonRow>& rows);

}  // namespace weft::memory
