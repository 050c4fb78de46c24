// CostModel::sync_wait: the measured wait of a collective by the compute its ranks did since
// their previous one (weft calibrate's step-like probe). What the model does with it: the
// curve's interpolation, the simulator's charge per collective at the burst before it (the
// engine and its re-timing alike), the stage model's per layer, the hardware file and the
// plan JSON carrying it, and nothing at all without it.
#include <gtest/gtest.h>

#include <cmath>

#include "planner/engine.h"
#include "planner/hardware.h"
#include "planner/plan_json.h"
#include "planner/planner.h"
#include "planner/schedule.h"
#include "planner/simulate.h"
#include "planner/stage_cost.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {

const std::vector<Axis> kOrder{Axis::kTp, Axis::kEp, Axis::kDp, Axis::kPp};

// Runs `p` under `cost` directly, and re-timed from a run recorded under `recorded`
// (engine_retime.h's fast path), and expects the same step, comm and wait seconds on every
// rank. Returns the direct run.
EngineResult expect_retime_equals_engine(const Plan& p, const core::Graph& g,
                                         const CostModel& recorded, const CostModel& cost) {
  EngineSchedule schedule;
  EngineOptions rec;
  rec.cost = &recorded;
  rec.record = &schedule;
  const EngineResult checked = run_programs(p, g, rec);
  EXPECT_TRUE(checked.errors.empty());
  EngineOptions o;
  o.cost = &cost;
  const EngineResult direct = run_programs(p, g, o), again = retime(p, g, schedule, checked, o);
  EXPECT_EQ(direct.ranks.size(), again.ranks.size());
  for (size_t r = 0; r < direct.ranks.size() && r < again.ranks.size(); ++r) {
    EXPECT_DOUBLE_EQ(direct.ranks[r].step_s, again.ranks[r].step_s) << "rank " << r;
    EXPECT_DOUBLE_EQ(direct.ranks[r].comm_s, again.ranks[r].comm_s) << "rank " << r;
    EXPECT_DOUBLE_EQ(direct.ranks[r].wait_s, again.ranks[r].wait_s) << "rank " << r;
  }
  return direct;
}

// A 2-core host running every rank on one node.
CostModel cpu_host(std::vector<std::pair<double, double>> curve) {
  CostModel cm;
  cm.cores = 2;
  cm.ranks_per_node = 1 << 20;
  cm.sync_wait_by_burst = std::move(curve);
  return cm;
}

TEST(SyncWait, InterpolatesInLogBurstAndClampsAtTheEnds) {
  const CostModel cm = cpu_host({{1e-4, 2e-4}, {1e-2, 4e-3}});
  EXPECT_DOUBLE_EQ(cm.sync_wait(1e-4, 2, 2), 2e-4);
  EXPECT_DOUBLE_EQ(cm.sync_wait(1e-2, 2, 2), 4e-3);
  EXPECT_DOUBLE_EQ(cm.sync_wait(0, 2, 2), 2e-4);    // below the first point
  EXPECT_DOUBLE_EQ(cm.sync_wait(1.0, 2, 2), 4e-3);  // above the last
  // 1e-3 lies halfway between the points in log(burst).
  EXPECT_NEAR(cm.sync_wait(1e-3, 2, 2), 0.5 * (2e-4 + 4e-3), 1e-15);
}

TEST(SyncWait, NothingWithoutTheCurveAGroupOrWithMoreRanksThanCores) {
  EXPECT_EQ(CostModel{}.sync_wait(1e-3, 8, 8), 0);
  const CostModel cm = cpu_host({{1e-4, 2e-4}});
  EXPECT_EQ(cm.sync_wait(1e-3, 1, 2), 0);  // a group of one synchronises nothing
  EXPECT_EQ(cm.sync_wait(1e-3, 2, 4), 0);  // 4 ranks on 2 cores: launch_oversub's regime
  EXPECT_GT(cm.sync_wait(1e-3, 2, 2), 0);
}

// tp 2 at world 2: each layer's two tensor-parallel all-reduces each way pay the curve's
// wait once; with sequence parallelism a reduce-scatter and an all-gather each, and the
// backward gathers each norm's output again (4 calls forward, 6 backward per layer).
TEST(SyncWait, TheStageModelChargesEachTensorParallelCollectiveOnce) {
  const core::JobSpec spec = test_util::gpt_spec(2, 64, 4, 256, 16);
  const core::ModelGraph mg = build_planning_graph(spec);
  const double w = 3e-4;
  const CostModel flat = cpu_host({{1e-6, w}, {1.0, w}}), none = cpu_host({});
  const Crossing cross = crossing(Degrees{1, 2, 1, 1}, kOrder, flat.ranks_per_node);
  ASSERT_EQ(cross.world, 2);
  const int64_t G = spec.train.global_batch;
  for (const bool sp : {false, true}) {
    SCOPED_TRACE(sp ? "sequence parallel" : "plain tp");
    const SplitCosts a = split_costs(mg.graph, flat, G, 2, 1, 2, cross, sp);
    const SplitCosts b = split_costs(mg.graph, none, G, 2, 1, 2, cross, sp);
    ASSERT_EQ(a.fwd.size(), 2u);
    for (size_t layer = 0; layer < a.fwd.size(); ++layer) {
      EXPECT_NEAR(a.fwd[layer] - b.fwd[layer], (sp ? 4 : 2) * w, 1e-12) << "layer " << layer;
      EXPECT_NEAR(a.bwd[layer] - b.bwd[layer], (sp ? 6 : 2) * w, 1e-12) << "layer " << layer;
    }
    EXPECT_EQ(a.layer_calls, b.layer_calls);
    EXPECT_GT(a.layer_calls, 0);
  }
  // Without tensor parallelism no layer synchronises.
  const SplitCosts dp =
      split_costs(mg.graph, flat, G, 1, 1, 2, crossing(Degrees{2, 1, 1, 1}, kOrder, 1 << 20));
  EXPECT_EQ(dp.layer_calls, 0);
}

// The whole candidate under dp 2 (ZeRO-0, no tp): the gradient all-reduce waits at the burst
// of every micro-batch's compute, the end-of-step norm all-reduce right after another call.
TEST(SyncWait, TheStageModelPricesTheGradientSyncAtTheStepsBurst) {
  const core::JobSpec spec = test_util::gpt_spec(2, 64, 4, 256, 16);
  const core::ModelGraph mg = build_planning_graph(spec);
  // Steep: 1 ms per second of burst, so that the burst read is visible in the result.
  const CostModel curve = cpu_host({{1e-6, 1e-9}, {1.0, 1e-3}}), none = cpu_host({});
  const Degrees deg{2, 1, 1, 1};
  const Crossing cross = crossing(deg, kOrder, curve.ranks_per_node);
  Layout l;
  l.deg = deg;
  l.micro_batch = 2;
  l.micro_batches = 2;
  l.chunk_layers = {2};
  const int64_t G = spec.train.global_batch;
  const SplitCosts sa = split_costs(mg.graph, curve, G, 1, 1, 2, cross);
  const SplitCosts sb = split_costs(mg.graph, none, G, 1, 1, 2, cross);
  const std::vector<int64_t> in_flight = stage_in_flight(l.schedule, 1, 1, 2);
  const Prediction a = predict(spec.model, sa, l, curve, cross, in_flight);
  const Prediction b = predict(spec.model, sb, l, none, cross, in_flight);
  const ChunkTime t = chunk_time(sb, l, none, cross, 0, 0, 2);
  // The norm's all-reduce spans tp x ep x pp = 1 rank: no call, no wait. (The trainer's
  // statistics exchange waits too: step_end_test.cc.)
  const double expected = curve.sync_wait(2 * (t.fwd + t.bwd), 2, 2);
  EXPECT_GT(a.exchange_s, b.exchange_s);
  EXPECT_NEAR((a.step_s - a.exchange_s) - (b.step_s - b.exchange_s), expected, 1e-12);
  EXPECT_GT(expected, 1e-6);  // the burst, not the curve's first point, priced it
}

core::JobSpec tp_job(int tp, int dp, bool sp) {
  core::JobSpec s = test_util::gpt_spec(2, 64, 4, 256, 16);
  s.parallel.tp = tp, s.parallel.dp = dp;
  s.parallel.sequence_parallel = sp;
  return s;
}

// The simulator charges each collective the wait at its members' longest burst since their
// previous collective: under a flat curve, rank r's step grows by its collectives x the
// wait (the ranks are symmetric, so no one waits for another's wait).
TEST(SyncWait, TheSimulatorChargesEveryCollectiveOnce) {
  for (const bool sp : {false, true}) {
    SCOPED_TRACE(sp ? "tp2 sequence parallel" : "tp2");
    const core::JobSpec s = tp_job(2, 1, sp);
    const core::ModelGraph mg = build_planning_graph(s);
    PlanOptions po;
    po.simulate = false;
    const Plan p = make_plan(s, mg.graph, 2, po);
    const double w = 2.5e-4;
    const CostModel flat = cpu_host({{1e-6, w}, {1.0, w}}), none = cpu_host({});
    const CostAnnotations a = simulate_plan(p, mg.graph, flat),
                          b = simulate_plan(p, mg.graph, none);
    const size_t calls =
        test_util::collectives(p.roles.at(0), [](const Instr&) { return true; }).size();
    ASSERT_GT(calls, 8u);
    // Beside the program's calls, the trainer's statistics exchange: two (step_end_test.cc).
    EXPECT_NEAR(a.exchange_s - b.exchange_s, 2 * w, 1e-12);
    EXPECT_NEAR(a.step_s - b.step_s, double(calls + 2) * w, 1e-9);
    EXPECT_NEAR(a.ranks[0].comm_s - b.ranks[0].comm_s, double(calls + 2) * w, 1e-9);
    EXPECT_NEAR(a.ranks[0].compute_s, b.ranks[0].compute_s, 1e-12);
  }
}

// The burst is the rank's own compute since its previous collective: under dp 2 the step grows by
// the sum, over rank 0's collectives, of the wait at the compute before each (the replicas run the
// same program, so their bursts are equal).
TEST(SyncWait, TheSimulatorReadsTheComputeSinceThePreviousCollective) {
  core::JobSpec s = test_util::gpt_spec(2, 64, 4, 256, 16);
  s.parallel.dp = 2;
  const core::ModelGraph mg = build_planning_graph(s);
  PlanOptions po;
  po.simulate = false;
  const Plan p = make_plan(s, mg.graph, 2, po);
  const CostModel curve = cpu_host({{1e-9, 1e-12}, {1.0, 1e-3}}), none = cpu_host({});
  const PlanDurations d = durations_alone(p, plan_work(p, mg.graph), none);
  const Role& role = p.roles.at(size_t(p.role_index(0)));
  double expected = 0, burst = 0;
  for (size_t i = 0; i < role.program.size(); ++i) {
    const Instr& in = role.program[i];
    burst += d.at(size_t(p.role_index(0)))[i] * none.sharing(2);
    if (in.kind != InstrKind::kCollective) continue;
    // The gradient all-reduce over the 2 replicas; the norm's over tp x pp, one rank: none.
    const int members = int(p.groups.at(size_t(p.group_id(in.group, 0))).ranks.size());
    expected += curve.sync_wait(burst, members, 2), burst = 0;
  }
  const CostAnnotations a = simulate_plan(p, mg.graph, curve), b = simulate_plan(p, mg.graph, none);
  EXPECT_GT(expected, 1e-7);
  // The trainer's statistics exchange apart (step_end_test.cc).
  EXPECT_NEAR((a.step_s - a.exchange_s) - (b.step_s - b.exchange_s), expected,
              1e-12 + 1e-9 * expected);
}

// The re-timing of a recorded run gives the engine's numbers under a model with the curve.
TEST(SyncWait, RetimeAgreesWithTheEngine) {
  const core::JobSpec s = tp_job(2, 2, true);
  const core::ModelGraph mg = build_planning_graph(s);
  PlanOptions po;
  po.simulate = false;
  const Plan p = make_plan(s, mg.graph, 4, po);
  const CostModel none = cpu_host({});
  CostModel curve = cpu_host({{1e-6, 1e-4}, {1e-2, 2e-3}});
  curve.cores = 4;  // world 4 within the cores: the curve applies
  const EngineResult direct = expect_retime_equals_engine(p, mg.graph, none, curve);
  EXPECT_GT(direct.ranks[0].step_s,
            run_programs(p, mg.graph, EngineOptions{&none}).ranks[0].step_s);
}

TEST(SyncWait, HardwareFileAndPlanJsonCarryTheCurve) {
  Hardware hw = load_hardware("h100");
  hw.sync_wait_by_burst = {{5e-5, 1.3e-4}, {2e-2, 2.5e-3}};
  const Hardware back = hardware_from_yaml(hardware_to_yaml(hw), "round trip");
  EXPECT_EQ(back.sync_wait_by_burst, hw.sync_wait_by_burst);
  EXPECT_EQ(back.cost_model().sync_wait_by_burst, hw.sync_wait_by_burst);
  // Absent from the presets: their models wait nothing.
  EXPECT_TRUE(load_hardware("h100").cost_model().sync_wait_by_burst.empty());

  const core::JobSpec s = tp_job(2, 1, false);
  const core::ModelGraph mg = build_planning_graph(s);
  PlanOptions po;
  po.cost = cpu_host({{1e-4, 2e-4}, {1e-2, 4e-3}});
  const Plan p = make_plan(s, mg.graph, 2, po);
  EXPECT_EQ(plan_from_json(plan_to_json(p)).costs.model.sync_wait_by_burst,
            po.cost.sync_wait_by_burst);
  // A plan under a model without the curve is written without the key, as before.
  PlanOptions plain;
  EXPECT_EQ(plan_to_json(make_plan(s, mg.graph, 2, plain)).find("sync_wait_by_burst"),
            std::string::npos);
}

TEST(SyncWait, BadCurvesNameTheField) {
  test_util::expect_bad_wait_curves_name_the_field("sync_wait_by_burst");
}

}  // namespace
}  // namespace weft::planner

namespace weft::planner {
namespace {

// A pipeline message waits as a collective of two at the longer of its two stages' bursts
// (compute since their last synchronisation), as the engine prices a receive: under GPipe
// the first stage sends its forwards without receiving anything (bursts a, 2a), the last
// receives each right after its previous forward (burst a) and sends its gradients after
// its forward and backwards (a + c, a + 2c), each met by the first stage's burst (2a, c).
// The drift variance travels with the messages; each stage ends with its burst.
TEST(SyncWait, TheStageModelWaitsAtTheLongerBurstOfAMessage) {
  // Steep: 1 ms per second of burst, so that each burst read is visible.
  const CostModel curve = cpu_host({{1e-6, 1e-9}, {1.0, 1e-3}});
  const double a = 1e-3, c = 2e-3;  // each forward, each backward
  Boundaries b;
  b.cost = &curve;
  b.world = 2;
  b.fwd_syncs = b.bwd_syncs = {0, 0};
  b.fwd_var = b.bwd_var = {0, 0};
  const ScheduleTiming t = time_schedule("gpipe", 2, 1, 2, {a, a}, {c, c}, nullptr, &b);
  auto W = [&](double burst) { return curve.message_wait(burst, 2); };
  // Stage 1 starts F1 at 2a + W(2a), then F1 and both backwards; the first backward's
  // gradient reaches stage 0 late (W(a + c)) but B1's later still (W(a + 2c)).
  EXPECT_NEAR(t.makespan, 3 * a + 3 * c + W(2 * a) + W(a + 2 * c), 1e-12);
  EXPECT_GT(W(a + 2 * c) - W(c), 1e-6);  // the receiver's burst alone would read c
  ASSERT_EQ(t.end_burst.size(), 2u);
  EXPECT_NEAR(t.end_burst[0], c, 1e-15);
  EXPECT_NEAR(t.end_burst[1], a + 2 * c, 1e-15);
  auto V = [&](double burst) { return curve.wait_variance(W(burst), 2); };
  EXPECT_NEAR(t.drift_var[1], V(a) + V(2 * a), 1e-18);
  EXPECT_NEAR(t.drift_var[0], V(a) + V(2 * a) + V(a + c) + V(a + 2 * c), 1e-18);
  EXPECT_GT(V(a), 0);
  // A unit that runs a collective restarts the burst: with every unit synchronising, each
  // message waits as right after a call, and so do the stages at their ends.
  b.fwd_syncs = b.bwd_syncs = {1, 1};
  const ScheduleTiming s = time_schedule("gpipe", 2, 1, 2, {a, a}, {c, c}, nullptr, &b);
  EXPECT_NEAR(s.makespan, 3 * a + 3 * c + 2 * W(0), 1e-12);
  EXPECT_EQ(s.end_burst, (std::vector<double>{0, 0}));
}

// In the simulator a receive is delayed by the wait when the receiver is there first, never
// more than once per message: pp 2 grows, by at most the curve times rank 0's receives and
// collectives, and the re-timing agrees with the engine.
TEST(SyncWait, TheSimulatorDelaysPipelineMessages) {
  core::JobSpec s = test_util::gpt_spec(4, 64, 4, 256, 16);
  s.parallel.pp = 2, s.parallel.dp = 1;
  s.parallel.pipeline.schedule = "1f1b";
  const core::ModelGraph mg = build_planning_graph(s);
  PlanOptions po;
  po.simulate = false;
  const Plan p = make_plan(s, mg.graph, 2, po);
  const double w = 3e-4;
  const CostModel flat = cpu_host({{1e-6, w}, {1.0, w}}), none = cpu_host({});
  const CostAnnotations a = simulate_plan(p, mg.graph, flat), b = simulate_plan(p, mg.graph, none);
  size_t syncs = 0;
  for (const Role& role : p.roles)
    for (const Instr& in : role.program)
      syncs += in.kind == InstrKind::kRecv || in.kind == InstrKind::kCollective;
  EXPECT_GT(a.step_s - b.step_s, w);
  EXPECT_LE(a.step_s - b.step_s, double(syncs) * w + 1e-12);

  expect_retime_equals_engine(p, mg.graph, none, flat);
}

}  // namespace
}  // namespace weft::planner
