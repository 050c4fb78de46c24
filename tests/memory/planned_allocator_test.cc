// PlannedAllocator: plan hits on a repeated step, correct service of steps the plan did
// not foresee (MoE sizes, extra and missing allocations), fallback, replan, bad frees.
#include "memory/planned_allocator.h"

#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "base/error.h"
#include "memory/synthetic_trace.h"
#include "memory_test_util.h"

namespace weft::memory {
namespace {

using testing::LiveRangeChecker;
using testing::replay_checked;

TEST(PlannedAllocator, RepeatedStepsAreServedExactlyAtThePlannedOffsets) {
  Trace t = synthesize_step(testing::small_model(Schedule::k1F1B), 0);
  PlannedAllocator a(t);
  const Plan& plan = a.plan();
  LiveRangeChecker checker;
  for (int step = 0; step < 3; ++step) {
    std::vector<uintptr_t> ptrs(t.records.size());
    ReplayOptions opt;
    opt.on_alloc = [&](size_t k, void* p, const TraceRecord&) {
      ptrs[k] = reinterpret_cast<uintptr_t>(p);
      checker.add(p, t.records[k].size);
    };
    opt.on_free = [&](size_t, void* p, const TraceRecord&) { checker.remove(p); };
    replay_trace(t, a, opt);
    // Addresses differ from each other exactly as the plan's offsets do.
    for (size_t k = 1; k < t.records.size(); ++k)
      ASSERT_EQ(ptrs[k] - ptrs[0], plan.offsets[k] - plan.offsets[0]) << "record " << k;
  }
  PlannedStats ps = a.planned_stats();
  EXPECT_EQ(ps.planned, 3 * t.records.size());
  EXPECT_EQ(ps.online + ps.fallback + ps.mismatches + ps.conflicts, 0u);
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.bytes_reserved_peak, block_size(plan.arena_bytes, 512));
  EXPECT_EQ(s.bytes_live, 0u);
  EXPECT_EQ(s.bytes_live_peak, peak_live_bytes(t));
  EXPECT_EQ(s.num_allocs, 3 * t.records.size());
}

TEST(PlannedAllocator, RandomAndTrainingTracesNeverOverlap) {
  std::vector<Trace> traces;
  for (uint64_t seed = 1; seed <= 4; ++seed)
    traces.push_back(testing::random_trace(seed, 3000, 1 << 18));
  for (Schedule s : {Schedule::kSequential, Schedule::k1F1B, Schedule::kInterleaved}) {
    StepModel m = testing::small_model(s);
    m.virtual_stages = s == Schedule::kInterleaved ? 2 : 1;
    m.recompute = s == Schedule::kSequential;
    traces.push_back(synthesize_step(m));
  }
  for (size_t i = 0; i < traces.size(); ++i) {
    PlannedAllocator a(traces[i]);
    LiveRangeChecker checker;
    for (uint64_t step = 0; step < 2; ++step) replay_checked(traces[i], a, checker, step);
    EXPECT_EQ(checker.live(), 0u);
    EXPECT_EQ(a.planned_stats().fallback, 0u) << "trace " << i;
    EXPECT_EQ(a.stats().bytes_live, 0u);
  }
}

TEST(PlannedAllocator, MoEStepsWithOtherRoutingAreServedIntact) {
  StepModel m = testing::small_model(Schedule::k1F1B);
  m.experts = 8;
  m.routing_skew = 1.0;
  PlannedAllocator a(synthesize_step(m, 0));
  LiveRangeChecker checker;
  size_t total = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    Trace t = synthesize_step(m, seed);
    total += t.records.size();
    replay_checked(t, a, checker, seed);
    ASSERT_EQ(checker.live(), 0u);
  }
  PlannedStats ps = a.planned_stats();
  EXPECT_GT(ps.mismatches, 0u);      // expert sizes changed
  EXPECT_GT(ps.grouped, 0u);         // and their group's region absorbed them
  EXPECT_GT(ps.planned, total / 2);  // the dense part of each step still hits the plan
  EXPECT_EQ(ps.planned + ps.grouped + ps.online + ps.fallback, total);
}

TEST(PlannedAllocator, SkewedRoutingWithMissingExpertsResynchronises) {
  StepModel m = testing::small_model(Schedule::k1F1B);
  m.experts = 8;
  m.seq = 8;
  m.routing_skew = 3;  // some experts get no tokens: allocations appear and disappear
  PlannedAllocator a(synthesize_step(m, 0));
  LiveRangeChecker checker;
  for (uint64_t seed = 1; seed <= 4; ++seed)
    replay_checked(synthesize_step(m, seed), a, checker, seed);
  PlannedStats ps = a.planned_stats();
  EXPECT_GT(ps.planned, ps.online + ps.fallback);
}

// Random edits of a trace: sizes changed, records dropped, records added. Whatever the
// allocator sees, blocks stay disjoint and intact.
Trace perturb(const Trace& t, uint64_t seed) {
  std::mt19937_64 rng(seed);
  TraceBuilder b;
  std::vector<int64_t> id(t.records.size(), -1);
  std::vector<std::pair<int64_t, int>> events(size_t(t.num_events), {-1, 0});
  for (size_t k = 0; k < t.records.size(); ++k) {
    events[size_t(t.records[k].alloc_event)] = {int64_t(k), 1};
    if (t.records[k].freed()) events[size_t(t.records[k].free_event)] = {int64_t(k), -1};
  }
  std::vector<size_t> extra;
  for (auto [k, kind] : events) {
    if (k < 0) continue;
    const TraceRecord& r = t.records[size_t(k)];
    if (kind == 1) {
      uint64_t roll = rng() % 100;
      if (roll < 5) continue;  // dropped
      uint64_t size = roll < 20 ? r.size * (1 + rng() % 3) / (1 + rng() % 3) : r.size;
      id[size_t(k)] = int64_t(b.alloc(size, r.tag));
      if (roll >= 95) extra.push_back(b.alloc(1 + rng() % 70000, Tag::kWorkspace));
    } else if (id[size_t(k)] >= 0) {
      b.free(size_t(id[size_t(k)]));
      if (!extra.empty() && rng() % 2) {
        b.free(extra.back());
        extra.pop_back();
      }
    }
  }
  for (size_t e : extra) b.free(e);
  return b.take();
}

TEST(PlannedAllocator, PerturbedStepsNeverOverlap) {
  Trace base = testing::random_trace(21, 2000, 1 << 17);
  StepModel m = testing::small_model(Schedule::kInterleaved);
  m.virtual_stages = 2;
  for (const Trace& t : {base, synthesize_step(m)}) {
    PlannedAllocator a(t);
    LiveRangeChecker checker;
    for (uint64_t seed = 1; seed <= 5; ++seed) {
      Trace p = perturb(t, seed);
      ASSERT_EQ(trace_error(p), "");
      replay_checked(p, a, checker, seed);
      ASSERT_EQ(checker.live(), 0u);
    }
    PlannedStats ps = a.planned_stats();
    EXPECT_GT(ps.planned, 0u);
    EXPECT_GT(ps.mismatches, 0u);
    EXPECT_EQ(a.stats().bytes_live, 0u);
  }
}

TEST(PlannedAllocator, AGroupAbsorbsMembersThatChangeSizeButNotTheirSum) {
  // Forward of one micro-batch: four expert tensors saved for backward, then a temporary.
  auto step = [](std::vector<uint64_t> experts) {
    TraceBuilder b;
    b.set_phase(Phase::kForward, 0);
    std::vector<size_t> saved;
    for (uint64_t n : experts) saved.push_back(b.alloc(n, Tag::kActivation));
    b.free(b.alloc(3 << 10, Tag::kWorkspace));
    b.set_phase(Phase::kBackward, 0);
    for (size_t id : saved) {
      b.free(b.alloc(1 << 10, Tag::kGradient));
      b.free(id);
    }
    return b.take();
  };
  Trace planned = step({4 << 10, 8 << 10, 12 << 10, 16 << 10});
  PlannedAllocator a(planned);
  ASSERT_EQ(a.plan().groups.size(), 1u);
  EXPECT_EQ(a.plan().groups[0].bytes, 40u << 10);
  LiveRangeChecker checker;
  replay_checked(step({16 << 10, 12 << 10, 8 << 10, 4 << 10}), a, checker, 1);
  replay_checked(step({1 << 10, 30 << 10, 1 << 10, 8 << 10}), a, checker, 2);
  PlannedStats ps = a.planned_stats();
  EXPECT_GT(ps.grouped, 0u);
  EXPECT_EQ(ps.online + ps.fallback, 0u);
  EXPECT_EQ(a.stats().bytes_reserved_peak, block_size(a.plan().arena_bytes, 512));
  // A sum larger than the group's region spills over, still without overlap.
  replay_checked(step({16 << 10, 16 << 10, 16 << 10, 16 << 10}), a, checker, 3);
  EXPECT_GT(a.planned_stats().online + a.planned_stats().fallback, 0u);
}

TEST(PlannedAllocator, BlocksLiveLongerThanPlannedAreMovedNotOverwritten) {
  TraceBuilder b;
  size_t x = b.alloc(4096, Tag::kActivation);
  b.free(x);
  size_t y = b.alloc(4096, Tag::kActivation);  // planned at x's offset
  b.free(y);
  Trace t = b.take();
  PlannedAllocator a(t);
  ASSERT_EQ(a.plan().offsets[x], a.plan().offsets[y]);
  a.begin_step();
  void* px = a.allocate(4096, Tag::kActivation);
  testing::fill_pattern(px, 4096, 1);
  void* py = a.allocate(4096, Tag::kActivation);  // x is still live: y must go elsewhere
  EXPECT_NE(px, py);
  testing::fill_pattern(py, 4096, 2);
  EXPECT_TRUE(testing::check_pattern(px, 4096, 1));
  EXPECT_EQ(a.planned_stats().conflicts, 1u);
  EXPECT_EQ(a.planned_stats().fallback, 1u);  // the arena holds one block only
  a.free(px);
  a.free(py);
  EXPECT_EQ(a.stats().bytes_live, 0u);
}

TEST(PlannedAllocator, UnforeseenRequestsUseIdleArenaRangesThenTheFallback) {
  // Plan: a big block [0, 64K) live during the first half, a small one after it.
  TraceBuilder b;
  size_t big = b.alloc(64 << 10, Tag::kActivation);
  b.free(big);
  size_t small = b.alloc(4096, Tag::kWorkspace);
  b.free(small);
  Trace t = b.take();
  PlannedAllocator a(t);
  a.begin_step();
  void* p = a.allocate(32 << 10, Tag::kActivation);  // same tag, smaller: takes big's slot
  EXPECT_EQ(a.planned_stats().planned, 1u);
  void* q = a.allocate(16 << 10, Tag::kComm);  // matches nothing: idle arena range
  EXPECT_EQ(a.planned_stats().mismatches, 1u);
  EXPECT_EQ(a.planned_stats().online, 1u);
  void* r = a.allocate(1 << 20, Tag::kComm);  // larger than the arena: fallback
  EXPECT_EQ(a.planned_stats().fallback, 1u);
  LiveRangeChecker checker;
  checker.add(p, 32 << 10);
  checker.add(q, 16 << 10);
  checker.add(r, 1 << 20);
  EXPECT_GT(a.stats().bytes_reserved, a.plan().arena_bytes + (1 << 20) - 1);
  for (void* v : {p, q, r}) a.free(v);
  a.empty_cache();
  EXPECT_EQ(a.stats().bytes_reserved, block_size(a.plan().arena_bytes, 512));
}

TEST(PlannedAllocator, RecordsLeftLiveByTheTraceGoToTheFallback) {
  TraceBuilder b;
  size_t w = b.alloc(1000, Tag::kWorkspace);
  b.alloc(1 << 16, Tag::kOptimizer);  // optimizer state created in the step, kept
  b.free(w);
  Trace t = b.take();
  PlannedAllocator a(t);
  a.begin_step();
  void* pw = a.allocate(1000, Tag::kWorkspace);
  void* state = a.allocate(1 << 16, Tag::kOptimizer);
  a.free(pw);
  PlannedStats ps = a.planned_stats();
  EXPECT_EQ(ps.planned, 1u);
  EXPECT_EQ(ps.fallback, 1u);
  EXPECT_EQ(ps.unplanned, 1u);
  // The state outlives the step; the next step's blocks never land on it.
  LiveRangeChecker checker;
  checker.add(state, 1 << 16);
  a.begin_step();
  void* pw2 = a.allocate(1000, Tag::kWorkspace);
  EXPECT_TRUE(checker.add(pw2, 1000));
  a.free(pw2);
  a.free(state);
}

TEST(PlannedAllocator, UnknownAndDoubleFreesThrowWithoutChangingState) {
  Trace t = testing::random_trace(3, 50, 4096);
  PlannedAllocator a(t);
  void* p = a.allocate(100);
  int local = 0;
  AllocatorStats before = a.stats();
  EXPECT_THROW(a.free(&local), InternalError);
  EXPECT_THROW(a.free(static_cast<char*>(p) + 64), InternalError);
  AllocatorStats after = a.stats();
  EXPECT_EQ(after.bytes_live, before.bytes_live);
  EXPECT_EQ(after.num_frees, before.num_frees);
  a.free(p);
  EXPECT_THROW(a.free(p), InternalError);
  EXPECT_EQ(a.stats().num_frees, 1u);
}

TEST(PlannedAllocator, ReplanKeepsOldBlocksValidUntilFreed) {
  Trace t1 = testing::random_trace(7, 400, 1 << 15);
  Trace t2 = synthesize_step(testing::small_model(Schedule::k1F1B));
  HostSegmentSource arena_source;
  PlannedAllocator a(t1, {}, &arena_source);
  a.begin_step();
  std::vector<void*> old;
  for (int i = 0; i < 5; ++i) {
    old.push_back(a.allocate(t1.records[size_t(i)].size, t1.records[size_t(i)].tag));
    testing::fill_pattern(old.back(), t1.records[size_t(i)].size, 100 + i);
  }
  size_t hits_before = a.planned_stats().planned;
  a.replan(t2);
  PlannedStats ps = a.planned_stats();
  EXPECT_EQ(ps.replans, 1u);
  EXPECT_GT(ps.retired_arena_bytes, 0u);
  LiveRangeChecker checker;
  for (int i = 0; i < 5; ++i) checker.add(old[size_t(i)], t1.records[size_t(i)].size);
  replay_checked(t2, a, checker);  // the new plan never lands on the old blocks
  // Old blocks sit in the retired arena, so the new plan is hit every time.
  EXPECT_EQ(a.planned_stats().planned, hits_before + t2.records.size());
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(testing::check_pattern(old[size_t(i)], t1.records[size_t(i)].size, 100 + i));
    a.free(old[size_t(i)]);
  }
  EXPECT_EQ(a.planned_stats().retired_arena_bytes, 0u);
  EXPECT_EQ(arena_source.bytes_held(), block_size(a.plan().arena_bytes, 512));
  EXPECT_EQ(a.stats().bytes_reserved, block_size(a.plan().arena_bytes, 512));
}

TEST(PlannedAllocator, RejectsAPlanForAnotherTrace) {
  Trace t1 = testing::random_trace(1, 200, 1 << 14);
  Trace t2 = testing::random_trace(2, 200, 1 << 14);
  EXPECT_THROW(PlannedAllocator(t1, plan_offline(t2)), InternalError);
}

TEST(PlannedAllocator, ConcurrentThreadsGetDisjointBlocks) {
  Trace t = synthesize_step(testing::small_model(Schedule::k1F1B));
  PlannedAllocator a(t);
  LiveRangeChecker checker;
  testing::hammer_from_threads(a, checker, 2000, 64 << 10, Tag::kActivation, 1);
  EXPECT_EQ(a.stats().bytes_live, 0u);
}

}  // namespace
}  // namespace weft::memory
