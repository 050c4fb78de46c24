// PlanCache: one plan per world size per process (an elastic worker's worlds), equal to what
// make_plan makes; plans made ahead on the background thread are the ones later asked for.
#include "planner/plan_cache.h"

#include <gtest/gtest.h>

#include "base/error.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {

// A global batch that 2, 3, 4 and 6 data-parallel ranks divide (micro_batch 2).
core::JobSpec gpt_spec(int64_t layers = 2) {
  core::JobSpec s = test_util::gpt_spec(layers);
  s.train.global_batch = 24;
  return s;
}

// The decisions of two plans: everything but the cost annotations.
void expect_same_plan(const Plan& a, const Plan& b) {
  EXPECT_EQ(a.mesh, b.mesh);
  EXPECT_EQ(a.config.deg, b.config.deg);
  EXPECT_EQ(a.decisions, b.decisions);
  EXPECT_EQ(a.families, b.families);
  ASSERT_EQ(a.groups.size(), b.groups.size());
  for (size_t i = 0; i < a.groups.size(); ++i) EXPECT_EQ(a.groups[i].ranks, b.groups[i].ranks);
  EXPECT_TRUE(a.roles == b.roles);
  EXPECT_EQ(a.model_hash, b.model_hash);
  EXPECT_EQ(a.shape_hash, b.shape_hash);
}

TEST(PlanCache, EachWorldSizeIsPlannedOnceAndEqualsMakePlan) {
  core::JobSpec spec = gpt_spec();
  PlanCache cache(spec);
  EXPECT_EQ(cache.plans_made(), 0);
  std::shared_ptr<const Plan> two = cache.plan(2);
  std::shared_ptr<const Plan> four = cache.plan(4);
  EXPECT_EQ(cache.plans_made(), 2);
  // The same object again, nothing planned.
  EXPECT_EQ(cache.plan(2).get(), two.get());
  EXPECT_EQ(cache.plan(4).get(), four.get());
  EXPECT_EQ(cache.plans_made(), 2);
  EXPECT_EQ(two->world(), 2);
  EXPECT_EQ(four->world(), 4);
  // What make_plan makes on its own graph, without simulation.
  expect_same_plan(*two, make_plan(spec, 2, training_plan_options()));
  expect_same_plan(*four, make_plan(spec, 4, training_plan_options()));
  EXPECT_FALSE(two->costs.valid) << "a trainer reads no costs: no simulation";
  // One planning graph for every size, the planner's own.
  EXPECT_EQ(cache.graph()->graph.values().size(), build_planning_graph(spec).graph.values().size());
  check_plan_matches(*two, spec, cache.graph()->graph);
}

TEST(PlanCache, APlanMadeAheadIsTheOneUsedWhenTheWorldComes) {
  core::JobSpec spec = gpt_spec();
  PlanCache cache(spec);
  std::shared_ptr<const Plan> now = cache.plan(4);
  cache.plan_ahead({3, 6, 2, 4, 0, -1});  // 4 is made; 0 and -1 are no sizes
  cache.wait_ahead();
  EXPECT_TRUE(cache.has(3));
  EXPECT_TRUE(cache.has(6));
  EXPECT_TRUE(cache.has(2));
  EXPECT_EQ(cache.plans_made(), 4);
  // The world of 3 arrives: its plan is the one made ahead, nothing is planned again.
  std::shared_ptr<const Plan> three = cache.plan(3);
  EXPECT_EQ(cache.plans_made(), 4);
  EXPECT_EQ(cache.plan(3).get(), three.get());
  expect_same_plan(*three, make_plan(spec, 3, training_plan_options()));
  EXPECT_EQ(cache.plan(4).get(), now.get());
}

// The caller asks for the world the background thread is planning right now, or for one
// still queued: it gets one plan, made once.
TEST(PlanCache, AskingWhilePlanningAheadMakesEachPlanOnce) {
  core::JobSpec spec = gpt_spec(8);
  for (int round = 0; round < 5; ++round) {
    PlanCache cache(spec);
    cache.plan_ahead({2, 3, 4});
    std::shared_ptr<const Plan> a = cache.plan(3);
    std::shared_ptr<const Plan> b = cache.plan(4);
    std::shared_ptr<const Plan> c = cache.plan(2);
    cache.wait_ahead();
    EXPECT_EQ(cache.plans_made(), 3);
    EXPECT_EQ(cache.plan(3).get(), a.get());
    EXPECT_EQ(cache.plan(4).get(), b.get());
    EXPECT_EQ(cache.plan(2).get(), c.get());
  }
}

// Degrees that do not fit a size: planning ahead skips it quietly, asking for it throws
// make_plan's error on the caller's thread, and nothing is cached.
TEST(PlanCache, ASizeTheDegreesDoNotFitFailsWhenAskedNotAhead) {
  core::JobSpec spec = gpt_spec();
  spec.parallel.tp = 2;
  PlanCache cache(spec);
  cache.plan_ahead({1, 3, 2});  // tp 2 needs an even world
  cache.wait_ahead();
  EXPECT_TRUE(cache.has(2));
  EXPECT_FALSE(cache.has(1));
  EXPECT_FALSE(cache.has(3));
  EXPECT_THROW(cache.plan(1), ConfigError);
  EXPECT_THROW(cache.plan(3), ConfigError);
  EXPECT_FALSE(cache.has(1));
  EXPECT_EQ(cache.plan(2)->config.deg.tp, 2);
}

// Destroyed with plans queued and one in progress: the queue is dropped, the thread joined
// (a hang fails the test's timeout).
TEST(PlanCache, DestroyedWhilePlanningAheadDropsTheQueue) {
  core::JobSpec spec = gpt_spec(8);
  for (int round = 0; round < 3; ++round) {
    PlanCache cache(spec);
    cache.plan_ahead({2, 3, 4, 6, 8, 12, 24});
    if (round == 1) cache.plan(2);
  }
}

// The layout-search memo belongs to whoever plans: two planners with different cost models,
// each with a cache of its own, fill only their own, and a plan made with a memo already
// full of its searches (a PlanCache's later worlds) equals one made from nothing.
TEST(PlanCache, TwoPlannersWithDifferentCostModelsKeepTheirOwnLayoutSearches) {
  core::JobSpec spec = gpt_spec();
  spec.parallel.tp = 2;
  PlanOptions a = training_plan_options(), b = training_plan_options();
  b.cost.op_overhead = 1e-3;
  b.cost.cores = 4;
  a.layout_cache = std::make_shared<RvdCache>();
  b.layout_cache = std::make_shared<RvdCache>();
  Plan pa = make_plan(spec, 4, a);
  const size_t a_entries = a.layout_cache->size();
  EXPECT_GT(a_entries, 0u) << "tp 2 converts layouts between its lanes";
  EXPECT_EQ(b.layout_cache->size(), 0u);
  Plan pb = make_plan(spec, 4, b);
  EXPECT_EQ(a.layout_cache->size(), a_entries)
      << "the second planner left the first one's memo alone";
  EXPECT_GT(b.layout_cache->size(), 0u);
  Plan again = make_plan(spec, 4, a);  // every search a hit
  EXPECT_EQ(a.layout_cache->size(), a_entries);
  expect_same_plan(pa, again);
  PlanOptions fresh = training_plan_options();  // make_plan's own memo for this plan
  expect_same_plan(pa, make_plan(spec, 4, fresh));
}

}  // namespace
}  // namespace weft::planner
