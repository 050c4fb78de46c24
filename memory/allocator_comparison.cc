// Allocator comparison: replay loops, the plan, the tables.
#include "memory/allocator_comparison.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <utility>

#include "base/check.h"
#include "memory/caching_allocator.h"
#include "memory/offline_planner.h"

namespace weft::memory {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double MiB = 1024.0 * 1024.0;
constexpr int kTimingPasses = 5;

// One step's events, prepared once so that the timed loop does nothing but call the
// allocator: +k+1 allocates record k, -(k+1) frees it; spans change before each op.
struct Replay {
  const Trace* trace;
  std::vector<int64_t> ops;
  std::vector<int32_t> span_of_op;
};

Replay prepare(const Trace& t) {
  Replay r{&t, std::vector<int64_t>(size_t(t.num_events)),
           std::vector<int32_t>(size_t(t.num_events))};
  for (size_t k = 0; k < t.records.size(); ++k) {
    const TraceRecord& rec = t.records[k];
    r.ops[size_t(rec.alloc_event)] = int64_t(k) + 1;
    r.span_of_op[size_t(rec.alloc_event)] = rec.alloc_span;
    if (rec.freed()) {
      r.ops[size_t(rec.free_event)] = -int64_t(k) - 1;
      r.span_of_op[size_t(rec.free_event)] = rec.free_span;
    }
  }
  return r;
}

// Runs one step; returns the seconds spent in allocator calls' loop.
double run_step(const Replay& r, Allocator& a, std::vector<void*>& ptrs) {
  const Trace& t = *r.trace;
  ptrs.assign(t.records.size(), nullptr);
  a.begin_step();
  int32_t span = -1;
  auto start = Clock::now();
  for (size_t i = 0; i < r.ops.size(); ++i) {
    int64_t op = r.ops[i];
    size_t k = size_t((op > 0 ? op : -op) - 1);
    const TraceRecord& rec = t.records[k];
    if (r.span_of_op[i] != span) {
      span = r.span_of_op[i];
      a.set_phase(op > 0 ? rec.phase : rec.free_phase,
                  op > 0 ? rec.micro_batch : rec.free_micro_batch);
    }
    if (op > 0) {
      ptrs[k] = a.allocate(rec.size, rec.tag);
    } else {
      a.free(ptrs[k]);
      ptrs[k] = nullptr;
    }
  }
  double secs = std::chrono::duration<double>(Clock::now() - start).count();
  for (void*& p : ptrs)  // what the step leaves live goes now, outside the timing
    if (p) a.free(std::exchange(p, nullptr));
  return secs;
}



}  // namespace

ComparisonRow compare_allocators(const std::string& name, const std::vector<Trace>& steps) {
  WEFT_CHECK(!steps.empty(), "compare_allocators needs at least one step");
  ComparisonRow res;
  res.name = name;
  res.allocs = steps[0].records.size();
  auto t0 = Clock::now();
  Plan plan = plan_offline(steps[0]);
  res.plan_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  res.plan_ratio = plan.lower_bound ? double(plan.arena_bytes) / double(plan.lower_bound) : 1.0;
  res.strategy = plan.strategy;
  std::vector<Replay> replays;
  for (const Trace& t : steps) replays.push_back(prepare(t));

  // Steps 0.. once for memory; then the replayed steps again, kTimingPasses times, and the
  // fastest pass gives ns/op (the machine is shared: the minimum is the least noisy).
  std::vector<void*> ptrs;
  uint64_t ops_warm = 0;
  for (size_t s = 1; s < steps.size(); ++s) ops_warm += uint64_t(steps[s].num_events);
  auto timed = [&](Allocator& a) {
    for (const Replay& r : replays) run_step(r, a, ptrs);
    double best = 1e30;
    for (int pass = 0; pass < kTimingPasses; ++pass) {
      double secs = 0;
      for (size_t s = 1; s < replays.size(); ++s) secs += run_step(replays[s], a, ptrs);
      best = std::min(best, secs);
    }
    return ops_warm ? best * 1e9 / double(ops_warm) : 0.0;
  };
  {
    CachingAllocator caching;
    res.caching_ns = timed(caching);
    res.caching_reserved = caching.stats().bytes_reserved_peak;
    res.lb = caching.stats().bytes_live_peak;
  }
  {
    PlannedAllocator planned(steps[0], plan);
    res.planned_ns = timed(planned);
    AllocatorStats st = planned.stats();
    PlannedStats ps = planned.planned_stats();
    res.planned_reserved = st.bytes_reserved_peak;
    res.hit = st.num_allocs ? double(ps.planned) / double(st.num_allocs) : 0;
    res.fallback_bytes = ps.fallback_bytes;
    res.ps = ps;
    WEFT_CHECK(st.bytes_live_peak == res.lb, name, ": the two replays saw different live peaks");
  }
  return res;
}

void print_serving_details(const std::vector<ComparisonRow>& rows) {
  std::printf(
      "\nplanned allocator, every replay (the steps, then 5 timing passes): requests served as"
      " planned / by their group's region / online in idle ranges / by the fallback pool\n");
  std::printf("%-28s %9s %9s %9s %9s %9s %9s %12s\n", "trace", "planned", "grouped", "online",
              "fallback", "mismatch", "conflict", "fallback MiB");
  for (const ComparisonRow& r : rows)
    std::printf("%-28s %9zu %9zu %9zu %9zu %9zu %9zu %12.1f\n", r.name.c_str(), r.ps.planned,
                r.ps.grouped, r.ps.online, r.ps.fallback, r.ps.mismatches, r.ps.conflicts,
                r.ps.fallback_bytes / MiB);
}

void print_comparison(const std::vector<ComparisonRow>& rows, bool csv) {
  if (csv) {
    std::printf(
        "trace,allocs,lb_mib,caching_reserved_mib,caching_frag,planned_reserved_mib,planned_frag,"
        "planned_over_caching,frag_reduction,plan_over_lb,plan_ms,caching_ns,planned_ns,hit,"
        "fallback_mib,strategy\n");
  } else {
    std::printf("%-28s %7s %9s %10s %6s %10s %6s %6s %7s %7s %8s %6s %6s %6s  %s\n", "trace",
                "allocs", "LB MiB", "cach MiB", "frag", "plan MiB", "frag", "p/c", "frag-",
                "plan/LB", "plan ms", "c ns", "p ns", "hit", "strategy");
  }
  double sum_reduction = 0;
  for (const ComparisonRow& r : rows) {
    double fc = 1.0 - double(r.lb) / double(r.caching_reserved);
    double fp = 1.0 - double(r.lb) / double(r.planned_reserved);
    double reduction = fc > 0 ? 1.0 - fp / fc : 0;
    sum_reduction += reduction;
    double ratio = double(r.planned_reserved) / double(r.caching_reserved);
    if (csv) {
      std::printf("%s,%zu,%.1f,%.1f,%.4f,%.1f,%.4f,%.4f,%.4f,%.4f,%.1f,%.1f,%.1f,%.4f,%.1f,%s\n",
                  r.name.c_str(), r.allocs, r.lb / MiB, r.caching_reserved / MiB, fc,
                  r.planned_reserved / MiB, fp, ratio, reduction, r.plan_ratio, r.plan_ms,
                  r.caching_ns, r.planned_ns, r.hit, r.fallback_bytes / MiB, r.strategy.c_str());
    } else {
      std::printf(
          "%-28s %7zu %9.1f %10.1f %5.1f%% %10.1f %5.1f%% %6.3f %6.1f%% %7.4f %8.1f %6.1f %6.1f "
          "%5.1f%%  %s\n",
          r.name.c_str(), r.allocs, r.lb / MiB, r.caching_reserved / MiB, 100 * fc,
          r.planned_reserved / MiB, 100 * fp, ratio, 100 * reduction, r.plan_ratio, r.plan_ms,
          r.caching_ns, r.planned_ns, 100 * r.hit, r.strategy.c_str());
    }
  }
  if (!csv && !rows.empty())
    std::printf("mean fragmentation reduction against caching: %.1f%%\n",
                100 * sum_reduction / double(rows.size()));
}

}  // namespace weft::memory
