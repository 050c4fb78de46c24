// CostModel::sync_wait_oversub_by_burst: the measured wait of a collective by the compute
// before it where a node runs more ranks than cores, which replaces launch_oversub there in
// the simulator and the stage model. What the model does with it: the regime it applies in
// (never within the cores), the exact replacement (a flat curve at launch_oversub gives the
// old step), the layout search and the plans left alone, pipeline messages paying it as a
// collective of two, and the hardware file and plan JSON carrying it.
#include <gtest/gtest.h>

#include <cmath>

#include "planner/hardware.h"
#include "planner/plan_json.h"
#include "planner/planner.h"
#include "planner/simulate.h"
#include "planner/stage_cost.h"
#include "planner/step_end.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {

const std::vector<Axis> kOrder{Axis::kTp, Axis::kEp, Axis::kDp, Axis::kPp};

// A 2-core host running every rank on one node, with a within-cores curve, launch_oversub
// and (when given) the oversubscribed curve.
CostModel cpu_host(std::vector<std::pair<double, double>> oversub) {
  CostModel cm;
  cm.cores = 2;
  cm.ranks_per_node = 1 << 20;
  cm.launch_oversub = 2e-3;
  cm.sync_wait_by_burst = {{1e-4, 1e-4}, {1e-2, 3e-3}};
  cm.sync_wait_oversub_by_burst = std::move(oversub);
  return cm;
}

core::JobSpec tp_pp_job(int dp) {
  core::JobSpec s = test_util::gpt_spec(2, 64, 4, 256, 16);
  s.parallel.tp = 2, s.parallel.pp = 2, s.parallel.dp = dp;
  return s;
}

TEST(SyncWaitOversub, ReplacesLaunchOversubOnlyAboveTheCores) {
  const CostModel with = cpu_host({{1e-4, 3e-3}, {1e-3, 1.4e-3}}), without = cpu_host({});
  // Within the cores (world 2) nothing moves: the same collective, wait and message wait.
  for (const double burst : {0.0, 5e-4, 1e-2}) {
    EXPECT_EQ(with.sync_wait(burst, 2, 2), without.sync_wait(burst, 2, 2));
    EXPECT_EQ(with.message_wait(burst, 2), without.sync_wait(burst, 2, 2));
  }
  EXPECT_EQ(with.collective(CollKind::kAllReduce, 2, 4096, false, 2),
            without.collective(CollKind::kAllReduce, 2, 4096, false, 2));
  // 4 ranks on 2 cores: the call's fixed part loses launch_oversub, its wait reads the
  // oversubscribed curve (interpolated in log(burst), clamped at its ends).
  EXPECT_DOUBLE_EQ(without.collective(CollKind::kAllReduce, 2, 4096, false, 4) -
                       with.collective(CollKind::kAllReduce, 2, 4096, false, 4),
                   without.launch_oversub);
  EXPECT_EQ(without.sync_wait(1e-4, 2, 4), 0);
  EXPECT_DOUBLE_EQ(with.sync_wait(1e-4, 2, 4), 3e-3);
  EXPECT_DOUBLE_EQ(with.sync_wait(0, 2, 4), 3e-3);
  EXPECT_DOUBLE_EQ(with.sync_wait(1.0, 8, 8), 1.4e-3);
  EXPECT_NEAR(with.sync_wait(std::sqrt(1e-7), 2, 4), 0.5 * (3e-3 + 1.4e-3), 1e-15);
  EXPECT_EQ(with.sync_wait(1e-4, 1, 4), 0);  // a group of one synchronises nothing
  // A pipeline message pays the wait of a collective of two there too (its receiver, woken,
  // waits for a core), and no launch_oversub either way: nothing without the curve.
  EXPECT_DOUBLE_EQ(with.message_wait(1e-4, 4), 3e-3);
  EXPECT_EQ(without.message_wait(1e-4, 4), 0);
  EXPECT_EQ(with.p2p(4096, false, 4), without.p2p(4096, false, 4));
  EXPECT_EQ(with.oversub_launch(4), 0);
  EXPECT_EQ(without.oversub_launch(4), without.launch_oversub);
  EXPECT_EQ(without.oversub_launch(2), 0);
}

// A flat curve at launch_oversub's value charges every collective what launch_oversub did
// where every rank is runnable (active_ranks pinned at the world: the curve's full weight,
// CostModel::runnable_weight): the same simulated step to rounding, for dp2 x tp2 at 4 ranks
// and dp4 x tp2 at 8 on 2 cores, which send no pipeline message (a message pays the curve
// and no launch_oversub: with pipelines the curve's step is the longer, below). A flat
// curve at twice that moves every oversubscribed step up, and the plan (its programs) is
// the same under all three models.
// (With the runnable ranks left to the simulator, these pipelines run fewer than all, and
// the curve's wait falls towards the within-cores one: runnable_test.cc.)
TEST(SyncWaitOversub, AFlatCurveAtLaunchOversubGivesTheOldStep) {
  for (const int dp : {1, 2}) {
    SCOPED_TRACE("dp " + std::to_string(dp));
    core::JobSpec s = tp_pp_job(2 * dp);
    s.parallel.pp = 1;
    const core::ModelGraph mg = build_planning_graph(s);
    const int world = 4 * dp;
    auto all_runnable = [&](CostModel cm) {
      cm.active_ranks = world;
      return cm;
    };
    const CostModel without = all_runnable(cpu_host({}));
    const double w = without.launch_oversub;
    // launch_oversub is a constant a call; the curve's waits spread, and the replicas drift
    // apart by them (CostModel::replica_drift): the same step without the spread, a longer
    // one with it.
    CostModel same = all_runnable(cpu_host({{1e-6, w}, {1.0, w}}));
    const CostModel spread = same;
    same.wait_spread = 0;
    const CostModel more = all_runnable(cpu_host({{1e-6, 2 * w}, {1.0, 2 * w}}));
    PlanOptions po;
    po.simulate = false;
    po.cost = without;
    const Plan p = make_plan(s, mg.graph, world, po);
    const CostAnnotations a = simulate_plan(p, mg.graph, without), b = simulate_plan(p, mg.graph, same),
                          c = simulate_plan(p, mg.graph, more);
    ASSERT_TRUE(a.valid && b.valid && c.valid);
    EXPECT_NEAR(b.step_s, a.step_s, 1e-9 * a.step_s);
    EXPECT_NEAR(b.exchange_s, a.exchange_s, 1e-12);
    EXPECT_GT(simulate_plan(p, mg.graph, spread).step_s, b.step_s + 0.5 * w);
    EXPECT_GT(c.step_s, a.step_s + w);  // every rank has several collectives a step
    // With pipeline messages (tp2 x pp2 at this world), the curve charges them too.
    const core::JobSpec piped = tp_pp_job(dp);
    const core::ModelGraph pg = build_planning_graph(piped);
    po.cost = without;
    const Plan pp = make_plan(piped, pg.graph, world, po);
    EXPECT_GT(simulate_plan(pp, pg.graph, same).step_s, simulate_plan(pp, pg.graph, without).step_s + w);
    // The plan's programs do not depend on the curve (the layout search keeps launch_oversub).
    for (const CostModel& cm : {same, more}) {
      po.cost = cm;
      const Plan q = make_plan(s, mg.graph, world, po);
      ASSERT_EQ(q.roles.size(), p.roles.size());
      for (size_t r = 0; r < p.roles.size(); ++r) {
        ASSERT_EQ(q.roles[r].program.size(), p.roles[r].program.size()) << "role " << r;
        for (size_t i = 0; i < p.roles[r].program.size(); ++i) {
          EXPECT_EQ(q.roles[r].program[i].kind, p.roles[r].program[i].kind);
          EXPECT_EQ(q.roles[r].program[i].bytes, p.roles[r].program[i].bytes);
        }
      }
    }
  }
}

// The curve is read at the burst: a falling curve (the oversubscribed shape: the longer the
// peers' compute, the less a woken rank waits for a core) charges less than its first point
// would at every call.
TEST(SyncWaitOversub, TheSimulatorReadsTheBurst) {
  const core::JobSpec s = tp_pp_job(1);
  const core::ModelGraph mg = build_planning_graph(s);
  PlanOptions po;
  po.simulate = false;
  const Plan p = make_plan(s, mg.graph, 4, po);
  const CostModel falling = cpu_host({{1e-9, 3e-3}, {1e-5, 1e-4}}),
                  high = cpu_host({{1e-9, 3e-3}, {1e-5, 3e-3}});
  const CostAnnotations f = simulate_plan(p, mg.graph, falling), h = simulate_plan(p, mg.graph, high);
  EXPECT_LT(f.step_s, h.step_s - 1e-3);
}

// The stage model prices an oversubscribed collective as the simulator does: without
// launch_oversub in the call under the curve, and the trainer's exchange with the curve's wait.
TEST(SyncWaitOversub, TheStageModelDropsLaunchOversubUnderTheCurve) {
  const CostModel with = cpu_host({{1e-6, 5e-4}, {1.0, 5e-4}}), without = cpu_host({});
  EXPECT_DOUBLE_EQ(collective_at(without, CollKind::kAllReduce, 2, 4096, false, 4) -
                       collective_at(with, CollKind::kAllReduce, 2, 4096, false, 4),
                   without.launch_oversub);
  EXPECT_EQ(collective_at(without, CollKind::kAllReduce, 2, 4096, false, 2),
            collective_at(with, CollKind::kAllReduce, 2, 4096, false, 2));
  // The exchange: two gathers, each launch_oversub less and 0.5 ms of wait more.
  EXPECT_NEAR(trainer_exchange_s(with, 4, 1e-3, false) - trainer_exchange_s(without, 4, 1e-3, false),
              2 * (5e-4 - without.launch_oversub), 1e-12);
  EXPECT_EQ(trainer_exchange_s(with, 2, 1e-3, false), trainer_exchange_s(without, 2, 1e-3, false));
}

TEST(SyncWaitOversub, HardwareFileAndPlanJsonCarryTheCurve) {
  Hardware hw = load_hardware("h100");
  hw.sync_wait_oversub_by_burst = {{1.3e-4, 2.9e-3}, {1.1e-3, 1.3e-3}};
  const Hardware back = hardware_from_yaml(hardware_to_yaml(hw), "round trip");
  EXPECT_EQ(back.sync_wait_oversub_by_burst, hw.sync_wait_oversub_by_burst);
  EXPECT_EQ(back.cost_model().sync_wait_oversub_by_burst, hw.sync_wait_oversub_by_burst);
  EXPECT_TRUE(load_hardware("h100").cost_model().sync_wait_oversub_by_burst.empty());
  EXPECT_EQ(hardware_to_yaml(load_hardware("h100")).find("sync_wait_oversub_by_burst"), std::string::npos);

  const core::JobSpec s = tp_pp_job(1);
  const core::ModelGraph mg = build_planning_graph(s);
  PlanOptions po;
  po.cost = cpu_host({{1e-4, 3e-3}, {1e-3, 1.4e-3}});
  const Plan p = make_plan(s, mg.graph, 4, po);
  EXPECT_EQ(plan_from_json(plan_to_json(p)).costs.model.sync_wait_oversub_by_burst,
            po.cost.sync_wait_oversub_by_burst);
  PlanOptions plain;
  EXPECT_EQ(plan_to_json(make_plan(s, mg.graph, 4, plain)).find("sync_wait_oversub_by_burst"),
            std::string::npos);
}

TEST(SyncWaitOversub, BadCurvesNameTheField) {
  test_util::expect_bad_wait_curves_name_the_field("sync_wait_oversub_by_burst");
}

}  // namespace
}  // namespace weft::planner

namespace weft::planner {
namespace {

// A pipeline's messages pay the oversubscribed wait as collectives of two do. pp 4 GPipe
// with one micro-batch on 4 ranks of 2 cores (every rank runnable, the curve's full weight)
// is one serial chain: three forward messages, three backward ones, then the step's
// collectives. Under a flat curve at W every synchronisation on that chain costs W more
// than under a flat curve at 0: the step grows by W for each of the six messages and for
// each collective of the chain's last rank (rank 0, whose backward ends the chain), plus
// the trainer's exchange (two gathers).
TEST(SyncWaitOversub, APipelinesMessagesPayTheCurveAsCollectivesOfTwo) {
  core::JobSpec s = test_util::gpt_spec(4, 64, 4, 256, 16);
  s.parallel.pp = 4, s.parallel.dp = 1;
  s.parallel.pipeline.schedule = "gpipe";
  s.train.micro_batch = s.train.global_batch;
  const core::ModelGraph mg = build_planning_graph(s);
  auto flat = [](double w) {
    CostModel cm = cpu_host({{1e-6, w}, {1.0, w}});
    cm.sync_wait_by_burst.clear();
    cm.active_ranks = 4;
    return cm;
  };
  const double w = 1e-3;
  PlanOptions po;
  po.simulate = false;
  po.cost = flat(0);
  const Plan p = make_plan(s, mg.graph, 4, po);
  const CostAnnotations zero = simulate_plan(p, mg.graph, flat(0)), one = simulate_plan(p, mg.graph, flat(w));
  ASSERT_TRUE(zero.valid && one.valid);
  int recvs = 0, collectives = 0;
  for (const Role& r : p.roles)
    for (const Instr& in : r.program) recvs += in.kind == InstrKind::kRecv;
  for (const Instr& in : p.roles.at(0).program) collectives += in.kind == InstrKind::kCollective;
  EXPECT_EQ(recvs, 6);
  EXPECT_NEAR(one.step_s - zero.step_s, w * (recvs + collectives + 2), 1e-9);
}

}  // namespace
}  // namespace weft::planner
