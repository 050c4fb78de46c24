// The CPU-host terms of the cost model (cores, op_overhead, launch_oversub): their defaults
// leave the GPU model unchanged, and each slows the prediction the way it says.
#include <gtest/gtest.h>

#include "planner/simulate.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {
using test_util::gpt_spec;

double step_s(const core::JobSpec& s, int world, const CostModel& cm) {
  core::ModelGraph mg = build_planning_graph(s);
  PlanOptions opt;
  opt.cost = cm;
  opt.simulate = false;
  Plan plan = make_plan(s, mg.graph, world, opt);
  CostAnnotations c = simulate_plan(plan, mg.graph, cm);
  EXPECT_TRUE(c.valid);
  return c.step_s;
}

TEST(PlannerCostModel, HostDefaultsKeepTheDeviceModel) {
  CostModel cm;
  EXPECT_EQ(cm.cores, 0);
  EXPECT_EQ(cm.op_overhead, 0);
  EXPECT_EQ(cm.launch_oversub, 0);
  for (int world : {0, 1, 8, 64}) EXPECT_EQ(cm.sharing(world), 1.0) << world;
  // The world argument changes nothing without cores.
  EXPECT_EQ(cm.compute(1e9, 1e6, 64), cm.compute(1e9, 1e6));
  EXPECT_EQ(cm.collective(CollKind::kAllReduce, 4, 1 << 20, false, 64),
            cm.collective(CollKind::kAllReduce, 4, 1 << 20, false));
  EXPECT_EQ(cm.p2p(1 << 20, false, 64), cm.p2p(1 << 20, false));
  EXPECT_EQ(cm.compute(4e12, 0), 4e12 / cm.flops);
}

TEST(PlannerCostModel, RanksOverCoresShareThem) {
  CostModel cm;
  cm.cores = 2;
  cm.ranks_per_node = 8;
  EXPECT_EQ(cm.sharing(1), 1.0);
  EXPECT_EQ(cm.sharing(2), 1.0);
  EXPECT_EQ(cm.sharing(4), 2.0);
  EXPECT_EQ(cm.sharing(8), 4.0);
  EXPECT_EQ(cm.sharing(64), 4.0) << "only a node's ranks share its cores";
  EXPECT_DOUBLE_EQ(cm.compute(4e12, 0, 4), 2 * cm.compute(4e12, 0, 2));
}

TEST(PlannerCostModel, OpOverheadAndOversubscribedLaunch) {
  CostModel cm;
  cm.op_overhead = 5e-6;
  EXPECT_DOUBLE_EQ(cm.compute(0, 0), 5e-6);
  EXPECT_DOUBLE_EQ(cm.local_copy(0), 5e-6);
  cm.cores = 2;
  cm.launch_oversub = 1e-3;
  const double two = cm.collective(CollKind::kAllReduce, 2, 4, false, 2);
  const double four = cm.collective(CollKind::kAllReduce, 2, 4, false, 4);
  EXPECT_NEAR(four - two, 1e-3, 1e-9) << "same group, more processes than cores: one wait";
  // Receives are posted ahead (parallel/executor.h): a message pays no wake-up wait.
  EXPECT_NEAR(cm.p2p(4, false, 4) - cm.p2p(4, false, 2), 0, 1e-9);
}

TEST(PlannerCostModel, SimulationSlowsWhenRanksShareCores) {
  core::JobSpec s = gpt_spec(2, 32, 4, 256, 16);
  s.train.global_batch = 8;
  s.train.micro_batch = 2;
  s.parallel.dp = 4;
  CostModel gpu;
  gpu.flops = 1e9;  // compute-bound, so that the sharing factor shows in the step
  gpu.mem_bw = 1e9;
  CostModel cpu = gpu;
  cpu.cores = 2;
  const double base = step_s(s, 4, gpu);
  EXPECT_GT(step_s(s, 4, cpu), 1.9 * base) << "4 ranks on 2 cores compute twice as slowly";
  cpu.cores = 4;
  EXPECT_DOUBLE_EQ(step_s(s, 4, cpu), base) << "a core per rank: as on devices";
  CostModel over = gpu;
  over.op_overhead = 1e-3;
  EXPECT_GT(step_s(s, 4, over), base + 1e-3);
}

TEST(PlannerCostModel, PipelineBubblesLeaveCoresToTheOtherStages) {
  // pp4 on 2 cores: a stage waiting in a bubble does not compete for a core, so the
  // processor-sharing fixed point is below the 2x of every rank computing at once.
  core::JobSpec s = gpt_spec(4, 32, 4, 256, 16);
  s.train.global_batch = 8;
  s.train.micro_batch = 2;
  s.parallel.dp = 1;
  s.parallel.pp = 4;
  s.parallel.pipeline.schedule = "gpipe";
  CostModel gpu;
  gpu.flops = 1e9;
  gpu.mem_bw = 1e9;
  CostModel shared = gpu, all_busy = gpu;
  shared.cores = all_busy.cores = 2;
  all_busy.active_ranks = 4;  // pinned: no fixed point, every rank shares all the time
  const double base = step_s(s, 4, gpu), fixed = step_s(s, 4, shared), worst = step_s(s, 4, all_busy);
  EXPECT_GE(fixed, base) << "sharing never speeds up";
  EXPECT_LT(fixed, 0.8 * worst) << "bubbles leave cores idle: well under the full 2x";
  EXPECT_GT(worst, 1.9 * base);
}

}  // namespace
}  // namespace weft::planner
