// A MoE gradient's sum inside a replica waits in a bucket too, and the bucket across the
// replicas reads what it wrote (planner/lower_preserve.cc's `waits`, lower_step.cc's bucket
// depths): on real ranks the numbers stay the single process's.
#include <gtest/gtest.h>

#include <cstdio>

#include "planner/planner.h"
#include "tests/parallel/layout_harness.h"

namespace weft::test {
namespace {

// ep 2 x dp 2 planned as for one replica per node, latency across nodes only: a dense
// gradient is reduce-scattered inside its replica, its half summed across the replicas
// and gathered back inside the replica (three moves), where one all-reduce over all 4
// ranks would pay 6 steps across the nodes; an expert's gradient is summed across the
// replicas only. Four buckets a rank: the reduce-scatters, the dense halves' sums across,
// the all-gathers and the experts' sums across (lower_stage.h's Bucket::depth orders them);
// the plan before issued 2 x 76 + 2 gradient calls a rank (each dense gradient's
// reduce-scatter and sum across alone).
TEST(MoeBucketLayout, Ep2Dp2SumsInsideEachReplicaThenAcrossInBuckets) {
  LayoutCase c{"moe-layout.yaml", 4, {"parallel.dp=2", "parallel.ep=2"}, 6, kRegroup};
  planner::CostModel cost;
  cost.ranks_per_node = 2;
  cost.launch = cost.alpha_intra = 0;
  cost.alpha_inter = 1e-3;
  c.cost = cost;

  // The plan: every gradient call of a rank is a bucket (one grouped call per family and
  // move), the sums inside the replica among them.
  const core::JobSpec spec = layout_spec(c);
  planner::PlanOptions po;
  po.simulate = false;
  po.cost = cost;
  const planner::Plan plan = planner::make_plan(spec, 4, po);
  for (int lane = 0; lane < 2; ++lane) {
    SCOPED_TRACE("lane " + std::to_string(lane));
    int inside = 0, across = 0;
    for (const planner::Instr& in : plan.role_of(lane).program) {
      if (in.kind != planner::InstrKind::kCollective || in.part != "grad.sync") continue;
      const std::vector<int>& ranks = plan.groups.at(size_t(plan.group_id(in.group, 0))).ranks;
      EXPECT_GT(in.in.size(), 1u) << "a gradient call of one tensor: not bucketed";
      (ranks == std::vector<int>{0, 1} ? inside : across)++;
    }
    EXPECT_EQ(inside, 2);  // the reduce-scatter, then the all-gather
    EXPECT_EQ(across, 2);  // the dense halves, then the experts' gradients
  }

  const LayoutOutcome o = run_layout(c);
  expect_invariant(c, o);
  // Every step's loss in full, for comparing runs bit for bit (the plan before these buckets
  // issued each gradient's calls alone; groups of two sum exactly alike either way).
  for (size_t s = 0; s < o.losses.size(); ++s) std::printf("  loss[%zu] %.17g\n", s, o.losses[s]);
}

}  // namespace
}  // namespace weft::test
