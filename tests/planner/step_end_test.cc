// The trainer's statistics exchange (planner/step_end.h): two all-gathers over the world
// before the optimizer, the second waiting at the optimizer's compute; simulate_plan and the
// search's stage model charge the same seconds, on top of the plan's program.
#include <gtest/gtest.h>

#include <algorithm>

#include "planner/engine.h"
#include "planner/planner.h"
#include "planner/simulate.h"
#include "planner/stage_cost.h"
#include "planner/step_end.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {

const std::vector<Axis> kOrder{Axis::kTp, Axis::kEp, Axis::kDp, Axis::kPp};

// A 2-core host running every rank on one node, with a steep curve (1 ms of wait per second
// of burst, so that the burst read shows) and no per-instruction overhead (so that the
// simulator's per-tensor optimizer instructions add up to the stage model's one term).
CostModel cpu_host(bool curve) {
  CostModel cm;
  cm.cores = 2;
  cm.ranks_per_node = 1 << 20;
  if (curve) cm.sync_wait_by_burst = {{1e-9, 1e-12}, {1.0, 1e-3}};
  return cm;
}

TEST(StepEnd, NothingAtWorldOneTwoSmallGathersAboveIt) {
  const CostModel cm = cpu_host(false);
  EXPECT_EQ(trainer_exchange_s(cm, 1, 1e-3, false), 0);
  const double two = cm.collective(CollKind::kAllGather, 2, 16, false, 2) +
                     cm.collective(CollKind::kAllGather, 2, 128, false, 2);
  EXPECT_DOUBLE_EQ(trainer_exchange_s(cm, 2, 1e-3, false), two);
  EXPECT_GT(two, 2 * cm.launch);
}

// The first gather follows the gradient norm (no burst), the second is followed by the
// optimizer: its wait is the curve's at the optimizer's seconds.
TEST(StepEnd, TheSecondGatherWaitsAtTheOptimizersCompute) {
  const CostModel cm = cpu_host(true), none = cpu_host(false);
  for (const double opt : {1e-4, 2e-3}) {
    const double wait = trainer_exchange_s(cm, 2, opt, false) - trainer_exchange_s(none, 2, opt, false);
    EXPECT_NEAR(wait, cm.sync_wait(0, 2, 2) + cm.sync_wait(opt, 2, 2), 1e-15);
  }
  EXPECT_GT(trainer_exchange_s(cm, 2, 2e-3, false), trainer_exchange_s(cm, 2, 1e-4, false) + 1e-6);
  // 4 ranks on 2 cores: launch_oversub's regime, no curve.
  EXPECT_DOUBLE_EQ(trainer_exchange_s(cm, 4, 2e-3, false), trainer_exchange_s(none, 4, 2e-3, false));
}

struct Case {
  const char* name;
  Degrees deg;
  std::vector<int64_t> chunk_layers;
};

// The same layout through the lowered plan's simulation and through the stage model: the
// same exchange, and in the simulator exactly the engine's step plus it.
TEST(StepEnd, TheSimulatorAndTheStageModelChargeTheSameExchange) {
  const CostModel cm = cpu_host(true);
  for (const Case& k : {Case{"dp2", Degrees{2, 1, 1, 1}, {2}}, Case{"tp2", Degrees{1, 2, 1, 1}, {2}}}) {
    SCOPED_TRACE(k.name);
    core::JobSpec s = test_util::gpt_spec(2, 64, 4, 256, 16);
    s.parallel.dp = int(k.deg.dp), s.parallel.tp = int(k.deg.tp), s.parallel.pp = int(k.deg.pp);
    s.train.micro_batch = 4;
    const core::ModelGraph mg = build_planning_graph(s);
    PlanOptions po;
    po.simulate = false;
    const Plan p = make_plan(s, mg.graph, 2, po);
    const CostAnnotations c = simulate_plan(p, mg.graph, cm);
    const EngineResult engine = run_programs(p, mg.graph, EngineOptions{&cm});
    double program = 0;
    for (const RankCost& rc : engine.ranks) program = std::max(program, rc.step_s);
    EXPECT_GT(c.exchange_s, 0);
    EXPECT_NEAR(c.step_s, program + c.exchange_s, 1e-12);

    const Crossing cross = crossing(k.deg, kOrder, cm.ranks_per_node);
    Layout l;
    l.deg = k.deg;
    l.micro_batch = 4;
    l.micro_batches = s.train.global_batch / 4 / k.deg.dp;
    l.chunk_layers = k.chunk_layers;
    const SplitCosts sc = split_costs(mg.graph, cm, s.train.global_batch, k.deg.tp, 1, 4, cross);
    const Prediction pr = predict(s.model, sc, l, cm, cross, stage_in_flight(l.schedule, 1, 1, int(l.micro_batches)));
    EXPECT_NEAR(pr.exchange_s, c.exchange_s, 1e-9 * c.exchange_s);
    // The wait read the optimizer's seconds, not the curve's first point.
    EXPECT_GT(c.exchange_s - trainer_exchange_s(cpu_host(false), 2, 0, false),
              2 * cm.sync_wait(0, 2, 2) + 1e-9);
  }
}

}  // namespace
}  // namespace weft::planner
