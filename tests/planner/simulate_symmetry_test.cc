// The simulator runs data-parallel replica 0 only and gives every replica its twin's
// results: for layouts whose replicas' groups cross nodes alike it must give exactly what
// running every rank gives.
#include <gtest/gtest.h>

#include "planner/engine.h"
#include "planner/simulate.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {

TEST(SimulateSymmetry, ReplicaZeroStandsForEveryReplica) {
  struct Case {
    int world, tp, pp, ep, zero, rpn;
    std::string schedule;
  };
  for (const Case& c : std::vector<Case>{{4, 1, 1, 1, 0, 8, "1f1b"},
                                         {8, 2, 2, 1, 1, 2, "1f1b"},
                                         {8, 1, 2, 1, 3, 4, "gpipe"},
                                         {16, 2, 2, 1, 2, 4, "interleaved"},
                                         {8, 1, 1, 2, 1, 2, "1f1b"}}) {
    core::JobSpec s = c.ep > 1 ? test_util::moe_spec(4, 2) : test_util::gpt_spec(4);
    s.train.global_batch = 32;
    s.parallel.tp = c.tp, s.parallel.pp = c.pp, s.parallel.ep = c.ep, s.parallel.zero = c.zero;
    s.parallel.pipeline.schedule = c.schedule;
    if (c.schedule == "interleaved") s.parallel.pipeline.virtual_stages = 2;
    SCOPED_TRACE("world " + std::to_string(c.world) + " tp" + std::to_string(c.tp) + " pp" +
                 std::to_string(c.pp) + " ep" + std::to_string(c.ep) + " zero" + std::to_string(c.zero) +
                 " " + c.schedule + " ranks_per_node " + std::to_string(c.rpn));
    core::ModelGraph mg = build_planning_graph(s);
    PlanOptions po;
    po.simulate = false;
    Plan p = make_plan(s, mg.graph, c.world, po);
    ASSERT_GT(p.mesh.degrees().dp, 1);
    CostModel cost;
    cost.ranks_per_node = c.rpn;
    EngineOptions all, one;
    all.cost = one.cost = &cost;
    all.timeline = one.timeline = true;
    one.one_replica = true;
    EngineResult a = run_programs(p, mg.graph, all), b = run_programs(p, mg.graph, one);
    EXPECT_TRUE(a.errors.empty() && b.errors.empty());
    ASSERT_EQ(a.ranks.size(), b.ranks.size());
    EXPECT_EQ(a.fb_end, b.fb_end);
    for (size_t r = 0; r < a.ranks.size(); ++r) {
      EXPECT_EQ(a.ranks[r].step_s, b.ranks[r].step_s) << "rank " << r;
      EXPECT_EQ(a.ranks[r].comm_s, b.ranks[r].comm_s) << "rank " << r;
      EXPECT_EQ(a.ranks[r].peak_bytes, b.ranks[r].peak_bytes) << "rank " << r;
      EXPECT_EQ(a.ranks[r].bubble, b.ranks[r].bubble) << "rank " << r;
      EXPECT_EQ(a.timeline[r].size(), b.timeline[r].size()) << "rank " << r;
    }
  }
}

}  // namespace
}  // namespace weft::planner
