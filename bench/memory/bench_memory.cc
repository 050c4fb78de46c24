// bench_memory: replays training-step traces through the caching allocator (PyTorch's
// design) and through the offline plan + planned allocator, and prints one table row each.
//
//   bench_memory                      the synthetic scenarios below
//   bench_memory --trace a.csv ...    traces recorded by TraceRecorder (replayed as is)
//   options: --steps N (default 4), --write-traces DIR, --csv
//
// Synthetic scenarios come from memory/synthetic_trace.h (its header documents the model
// of a transformer step). Step 0's trace is planned; steps 1.. are replayed through both
// allocators. Dense steps repeat exactly; MoE steps draw new routing every step, so the
// plan meets sizes and counts it did not see. Columns:
//   LB        peak live bytes (the lower bound of any allocator), over all steps
//   reserved  peak bytes held from the system (caching: segments; planned: arena +
//             fallback pool), and frag = 1 - LB / reserved for each allocator
//   plan/LB   the offline plan's arena over its own trace's bound
//   ns/op     wall time per allocate or free in the replay of steps 1.. (warm; the
//             fastest of 5 passes); hit: the share of requests served as planned
// A second table counts how the planned allocator served the requests.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "memory/caching_allocator.h"
#include "memory/offline_planner.h"
#include "memory/planned_allocator.h"
#include "memory/synthetic_trace.h"

using namespace weft::memory;
using Clock = std::chrono::steady_clock;

namespace {

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

struct Result {
  std::string name;
  size_t allocs = 0;
  uint64_t lb = 0, caching_reserved = 0, planned_reserved = 0;
  double plan_ratio = 0, plan_ms = 0, caching_ns = 0, planned_ns = 0, hit = 0;
  uint64_t fallback_bytes = 0;
  std::string strategy;
  PlannedStats ps;
};

Result run(const std::string& name, const std::vector<Trace>& steps) {
  Result res;
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
    if (st.bytes_live_peak != res.lb) {
      std::fprintf(stderr, "%s: the two replays saw different live peaks\n", name.c_str());
      std::exit(1);
    }
  }
  return res;
}

struct Scenario {
  std::string name;
  StepModel model;
};

std::vector<Scenario> scenarios() {
  StepModel gpt;  // GPT, C=2048, F=8192, NH=16, T=2048, B=1; pp4 stage 0 holds 6 layers
  gpt.hidden = 2048;
  gpt.ffn = 8192;
  gpt.heads = 16;
  gpt.seq = 2048;
  gpt.layers = 6;
  gpt.stages = 4;
  gpt.micro_batches = 8;
  std::vector<Scenario> out;
  StepModel seq = gpt;  // one process: 24 layers, gradient accumulation over 4 micro-batches
  seq.schedule = Schedule::kSequential;
  seq.stages = 1;
  seq.layers = 24;
  seq.micro_batches = 4;
  out.push_back({"gpt-seq-ga4", seq});
  out.push_back({"gpt-1f1b-pp4", gpt});
  StepModel rc = gpt;
  rc.recompute = true;
  out.push_back({"gpt-1f1b-recompute", rc});
  StepModel vpp = gpt;
  vpp.schedule = Schedule::kInterleaved;
  vpp.virtual_stages = 2;
  out.push_back({"gpt-interleaved-v2", vpp});
  StepModel vrc = vpp;
  vrc.recompute = true;
  out.push_back({"gpt-interleaved-rc", vrc});
  StepModel moe = gpt;  // 8 experts, top-2, expert FFN 4096, dropless
  moe.experts = 8;
  moe.top_k = 2;
  moe.routing_skew = 0.5;
  out.push_back({"moe-1f1b", moe});
  StepModel skew = moe;
  skew.routing_skew = 1.5;
  skew.recompute = true;
  out.push_back({"moe-1f1b-skew-rc", skew});
  return out;
}

void print_details(const std::vector<Result>& rows) {
  std::printf(
      "\nplanned allocator, every replay (the steps, then 5 timing passes): requests served as"
      " planned / by their group's region / online in idle ranges / by the fallback pool\n");
  std::printf("%-20s %9s %9s %9s %9s %9s %9s %12s\n", "trace", "planned", "grouped", "online",
              "fallback", "mismatch", "conflict", "fallback MiB");
  for (const Result& r : rows)
    std::printf("%-20s %9zu %9zu %9zu %9zu %9zu %9zu %12.1f\n", r.name.c_str(), r.ps.planned,
                r.ps.grouped, r.ps.online, r.ps.fallback, r.ps.mismatches, r.ps.conflicts,
                r.ps.fallback_bytes / MiB);
}

void print(const std::vector<Result>& rows, bool csv) {
  if (csv) {
    std::printf(
        "trace,allocs,lb_mib,caching_reserved_mib,caching_frag,planned_reserved_mib,planned_frag,"
        "planned_over_caching,frag_reduction,plan_over_lb,plan_ms,caching_ns,planned_ns,hit,"
        "fallback_mib,strategy\n");
  } else {
    std::printf("%-20s %7s %9s %10s %6s %10s %6s %6s %7s %7s %8s %6s %6s %6s  %s\n", "trace",
                "allocs", "LB MiB", "cach MiB", "frag", "plan MiB", "frag", "p/c", "frag-",
                "plan/LB", "plan ms", "c ns", "p ns", "hit", "strategy");
  }
  double sum_reduction = 0;
  for (const Result& r : rows) {
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
          "%-20s %7zu %9.1f %10.1f %5.1f%% %10.1f %5.1f%% %6.3f %6.1f%% %7.4f %8.1f %6.1f %6.1f "
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

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "bench_memory: %s\nusage: bench_memory [--trace FILE]... [--steps N] "
               "[--write-traces DIR] [--csv]\n",
               why);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> files;
  std::string write_dir;
  int steps = 4;
  bool csv = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value for " + a).c_str());
      return argv[++i];
    };
    if (a == "--trace")
      files.push_back(value());
    else if (a == "--steps")
      steps = std::atoi(value().c_str());
    else if (a == "--write-traces")
      write_dir = value();
    else if (a == "--csv")
      csv = true;
    else
      usage(("unknown argument " + a).c_str());
  }
  if (steps < 2) usage("--steps must be at least 2 (one planned, one or more replayed)");
  std::vector<Result> rows;
  try {
    if (!files.empty()) {
      for (const std::string& f : files) {
        Trace t = load_trace(f);
        std::string name = f.substr(f.find_last_of('/') + 1);  // npos + 1 == 0: no folder
        rows.push_back(run(name, std::vector<Trace>(size_t(steps), t)));
      }
    } else {
      for (const Scenario& s : scenarios()) {
        std::vector<Trace> traces;
        for (int k = 0; k < steps; ++k) traces.push_back(synthesize_step(s.model, uint64_t(k)));
        if (!write_dir.empty()) save_trace(traces[0], write_dir + "/" + s.name + ".csv");
        rows.push_back(run(s.name, traces));
      }
    }
  } catch (const weft::Error& e) {
    std::fprintf(stderr, "bench_memory: %s\n", e.what());
    return 1;
  }
  print(rows, csv);
  if (!csv) print_details(rows);
  return 0;
}
