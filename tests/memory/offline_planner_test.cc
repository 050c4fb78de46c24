// Offline planner: valid plans on random and training-like traces, the lower bound, exact
// packing where it is trivial, and a validator that catches bad plans.
#include "memory/offline_planner.h"

#include <gtest/gtest.h>

#include "base/error.h"
#include "memory/synthetic_trace.h"
#include "memory_test_util.h"

namespace weft::memory {
namespace {

void expect_valid(const Trace& t, const Plan& p, const std::string& what) {
  PlanCheck c = check_plan(t, p);
  EXPECT_TRUE(c.ok) << what << ": " << c.message;
  EXPECT_GE(p.arena_bytes, p.lower_bound) << what;
  EXPECT_EQ(p.lower_bound, peak_live_bytes(t, p.alignment)) << what;  // all freed here
  for (size_t k = 0; k < t.records.size(); ++k) EXPECT_TRUE(p.planned(k)) << what;
}

TEST(OfflinePlanner, RandomTracesGetValidPlansAboveTheLowerBound) {
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    Trace t = testing::random_trace(seed, 1500, seed % 2 ? 1 << 20 : 4096);
    for (bool grouping : {false, true}) {
      PlannerOptions opt;
      opt.try_grouping = grouping;
      opt.alignment = seed % 3 == 0 ? 64 : 512;
      Plan p = plan_offline(t, opt);
      expect_valid(t, p, "seed " + std::to_string(seed));
      EXPECT_FALSE(p.strategy.empty());
      EXPECT_FALSE(p.candidates.empty());
      for (const PlanCandidate& c : p.candidates) EXPECT_GE(c.arena_bytes, p.arena_bytes);
    }
  }
}

TEST(OfflinePlanner, TrainingLikeTracesGetValidPlans) {
  for (Schedule s : {Schedule::kSequential, Schedule::k1F1B, Schedule::kInterleaved}) {
    for (bool recompute : {false, true}) {
      for (int experts : {0, 8}) {
        StepModel m = testing::small_model(s);
        m.virtual_stages = s == Schedule::kInterleaved ? 2 : 1;
        m.recompute = recompute;
        m.experts = experts;
        Trace t = synthesize_step(m, 11);
        Plan p = plan_offline(t);
        std::string what =
            std::to_string(int(s)) + (recompute ? " recompute" : "") + (experts ? " moe" : "");
        expect_valid(t, p, what);
        // Forward activations freed in backward form lifetime groups.
        EXPECT_GT(p.num_groups, 0u) << what;
        // The grouped candidates were tried, unless a flat one already hit the bound.
        EXPECT_TRUE(p.candidates.back().strategy.rfind("group+", 0) == 0 ||
                    p.arena_bytes == p.lower_bound)
            << what;
      }
    }
  }
}

TEST(OfflinePlanner, TriviallyPackableTracesReachTheLowerBound) {
  // Disjoint lifetimes: everything can share offset 0.
  TraceBuilder a;
  for (uint64_t n : {3000, 70000, 512, 9000}) a.free(a.alloc(n));
  Trace ta = a.take();
  Plan pa = plan_offline(ta);
  EXPECT_EQ(pa.arena_bytes, pa.lower_bound);
  EXPECT_EQ(pa.arena_bytes, block_size(70000, 512));
  for (uint64_t off : pa.offsets) EXPECT_EQ(off, 0u);

  // A stack (forward allocations freed in reverse in backward): everything is live at the
  // turn, so the arena is the sum.
  TraceBuilder b;
  std::vector<size_t> ids;
  b.set_phase(Phase::kForward, 0);
  for (uint64_t n : {1 << 20, 4096, 1 << 16, 777, 1 << 18}) ids.push_back(b.alloc(n));
  b.set_phase(Phase::kBackward, 0);
  for (auto it = ids.rbegin(); it != ids.rend(); ++it) b.free(*it);
  Trace tb = b.take();
  Plan pb = plan_offline(tb);
  EXPECT_EQ(pb.arena_bytes, pb.lower_bound);
  EXPECT_EQ(pb.lower_bound, (1u << 20) + 4096 + (1 << 16) + 1024 + (1 << 18));

  // Two micro-batches one after the other, each a stack of equal shape: the second reuses
  // the first one's addresses.
  TraceBuilder c;
  for (int mb = 0; mb < 2; ++mb) {
    std::vector<size_t> saved;
    c.set_phase(Phase::kForward, mb);
    for (int l = 0; l < 6; ++l) {
      saved.push_back(c.alloc(8192 * (l + 1), Tag::kActivation));
      c.free(c.alloc(100000, Tag::kWorkspace));
    }
    c.set_phase(Phase::kBackward, mb);
    for (auto it = saved.rbegin(); it != saved.rend(); ++it) c.free(*it);
  }
  Trace tc = c.take();
  Plan pc = plan_offline(tc);
  expect_valid(tc, pc, "two stacks");
  EXPECT_EQ(pc.arena_bytes, pc.lower_bound);
}

TEST(OfflinePlanner, RecordsLeftLiveAreUnplannedUnlessAsked) {
  TraceBuilder b;
  size_t x = b.alloc(4096);
  size_t keep = b.alloc(1 << 16, Tag::kOptimizer);
  b.free(x);
  size_t y = b.alloc(8192);
  b.free(y);
  Trace t = b.take();
  Plan p = plan_offline(t);
  EXPECT_TRUE(check_plan(t, p).ok);
  EXPECT_FALSE(p.planned(keep));
  EXPECT_TRUE(p.planned(x) && p.planned(y));
  EXPECT_EQ(p.arena_bytes, 8192u);
  PlannerOptions all;
  all.plan_unfreed = true;
  Plan q = plan_offline(t, all);
  EXPECT_TRUE(check_plan(t, q).ok);
  EXPECT_TRUE(q.planned(keep));
  EXPECT_EQ(q.arena_bytes, (1u << 16) + 8192u);
}

TEST(OfflinePlanner, PlansAreDeterministic) {
  Trace t = synthesize_step(testing::small_model(Schedule::k1F1B), 0);
  Plan a = plan_offline(t), b = plan_offline(t);
  EXPECT_EQ(a.offsets, b.offsets);
  EXPECT_EQ(a.strategy, b.strategy);
}

TEST(OfflinePlanner, CheckPlanCatchesOverlapsMisalignmentAndOverflow) {
  Trace t = testing::random_trace(99, 300, 1 << 14);
  PlannerOptions flat;
  flat.try_grouping = false;  // so that a moved block can only be caught as an overlap
  Plan good = plan_offline(t, flat);
  ASSERT_TRUE(check_plan(t, good).ok);
  EXPECT_TRUE(good.groups.empty());
  // Find two records whose lifetimes overlap and put them at the same offset.
  auto overlapping_pair = [&]() -> std::pair<size_t, size_t> {
    for (size_t i = 0; i < t.records.size(); ++i)
      if (i + 1 < t.records.size() && t.records[i + 1].alloc_event < t.end_of(t.records[i]))
        return {i, i + 1};
    return {0, 0};
  };
  auto [i, j] = overlapping_pair();
  ASSERT_NE(j, 0u);
  Plan overlap = good;
  overlap.offsets[j] = overlap.offsets[i];
  PlanCheck c = check_plan(t, overlap);
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.message.find("overlap"), std::string::npos) << c.message;

  Plan misaligned = good;
  misaligned.offsets[0] += 64;
  EXPECT_FALSE(check_plan(t, misaligned).ok);
  Plan outside = good;
  outside.arena_bytes -= 512;
  EXPECT_FALSE(check_plan(t, outside).ok);
  Plan short_size = good;
  short_size.sizes[3] = 0;
  EXPECT_FALSE(check_plan(t, short_size).ok);
  Plan missing = good;
  missing.offsets.pop_back();
  EXPECT_FALSE(check_plan(t, missing).ok);
}

TEST(OfflinePlanner, CheckPlanHoldsGroupsToTheirRegions) {
  Trace t = synthesize_step(testing::small_model(Schedule::k1F1B), 0);
  Plan p = plan_offline(t);
  ASSERT_TRUE(check_plan(t, p).ok);
  ASSERT_FALSE(p.groups.empty());
  // A member moved out of its region, and an outsider moved into a region while the
  // group holds it whole, are both caught.
  size_t member = 0;
  while (p.group_of[member] < 0) ++member;
  Plan out = p;
  const PlanGroup& g = p.groups[size_t(p.group_of[member])];
  out.offsets[member] = g.offset + g.bytes;
  EXPECT_FALSE(check_plan(t, out).ok);
  bool tried = false;
  for (size_t k = 0; k < t.records.size() && !tried; ++k) {
    if (p.group_of[k] >= 0) continue;
    for (const PlanGroup& grp : p.groups) {
      if (t.records[k].alloc_event < grp.first_free && grp.s < t.end_of(t.records[k]) &&
          p.sizes[k] <= grp.bytes) {
        Plan in = p;
        in.offsets[k] = grp.offset;
        EXPECT_FALSE(check_plan(t, in).ok) << "record " << k;
        tried = true;
        break;
      }
    }
  }
  EXPECT_TRUE(tried);
}

TEST(OfflinePlanner, RejectsBadTracesAndAlignments) {
  Trace bad;
  bad.num_events = 2;
  bad.records.push_back(TraceRecord{.size = 1, .alloc_event = 1, .free_event = 0});
  EXPECT_THROW(plan_offline(bad), InternalError);
  PlannerOptions opt;
  opt.alignment = 96;
  EXPECT_THROW(plan_offline(Trace{}, opt), InternalError);
  Plan empty = plan_offline(Trace{});
  EXPECT_EQ(empty.arena_bytes, 0u);
  EXPECT_TRUE(check_plan(Trace{}, empty).ok);
}

}  // namespace
}  // namespace weft::memory
