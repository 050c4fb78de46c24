// Where ranks outnumber cores, the oversubscribed wait and the processor sharing follow the
// ranks RUNNABLE per core (CostModel::active_ranks, runnable_weight): a pipeline's stages
// wait in turn, so fewer compete for the cores than in the probe that measured
// sync_wait_oversub_by_burst, where every process looped. What the model does with it: the
// weight and the interpolation between the two curves, the simulator's fixed point on a
// pipeline and on a layout with no pipeline, the stage model's schedule estimate, nothing
// within the cores, and the hardware file and plan JSON carrying sync_wait_oversub_ranks.
#include <gtest/gtest.h>

#include "planner/hardware.h"
#include "planner/plan_json.h"
#include "planner/planner.h"
#include "planner/search.h"
#include "planner/simulate.h"
#include "planner/stage_cost.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {

// A 2-core host running every rank on one node: a within-cores curve (0.1 ms) and an
// oversubscribed one ten times higher, measured at 4 ranks.
CostModel cpu_host() {
  CostModel cm = test_util::two_core_host(2e-3);
  cm.sync_wait_by_burst = {{1e-6, 1e-4}, {1.0, 1e-4}};
  cm.sync_wait_oversub_by_burst = {{1e-6, 1e-3}, {1.0, 1e-3}};
  cm.sync_wait_oversub_ranks = 4;
  return cm;
}

CostModel pinned(CostModel cm, double runnable) {
  cm.active_ranks = runnable;
  return cm;
}

core::JobSpec job(int dp, int tp, int pp) {
  core::JobSpec s = test_util::gpt_spec(2, 64, 4, 256, 16);
  s.parallel.dp = dp, s.parallel.tp = tp, s.parallel.pp = pp;
  return s;
}

// `s` planned for `world` ranks on cpu_host(), not simulated: each test simulates it under
// the models it compares.
Plan plan_unsimulated(const core::JobSpec& s, const core::ModelGraph& mg, int world) {
  PlanOptions po;
  po.simulate = false;
  po.cost = cpu_host();
  return make_plan(s, mg.graph, world, po);
}

TEST(Runnable, TheWaitRunsFromTheWithinCoresCurveToTheMeasuredOne) {
  const CostModel cm = cpu_host();
  // 4 ranks on 2 cores, the curve measured at 4: every rank runnable reads the curve as
  // measured, no more than the cores the within-cores one, and linearly between.
  EXPECT_EQ(cm.sync_wait(1e-4, 2, 4), 1e-3);  // active_ranks 0: every rank
  EXPECT_EQ(pinned(cm, 4).sync_wait(1e-4, 2, 4), 1e-3);
  EXPECT_DOUBLE_EQ(pinned(cm, 3).runnable_weight(4), 0.5);
  EXPECT_DOUBLE_EQ(pinned(cm, 3).sync_wait(1e-4, 2, 4), 1e-4 + 0.5 * 9e-4);
  EXPECT_EQ(pinned(cm, 2).sync_wait(1e-4, 2, 4), 1e-4);
  EXPECT_EQ(pinned(cm, 1.2).sync_wait(1e-4, 2, 4), 1e-4);
  // 8 ranks: 4 runnable are as many as the probe had, so the whole curve; 3 half of it.
  EXPECT_EQ(pinned(cm, 4).sync_wait(1e-4, 2, 8), 1e-3);
  EXPECT_DOUBLE_EQ(pinned(cm, 3).sync_wait(1e-4, 2, 8), 1e-4 + 0.5 * 9e-4);
  // Without the probe's ranks recorded, the curve stands for every rank of the node.
  CostModel unknown = cpu_host();
  unknown.sync_wait_oversub_ranks = 0;
  EXPECT_DOUBLE_EQ(pinned(unknown, 5).runnable_weight(8), 0.5);
  EXPECT_EQ(pinned(unknown, 5).runnable_weight(4), 1.0);
  // The sharing follows the same count: 3 runnable on 2 cores compute 1.5 times slower,
  // 2 or fewer at full speed.
  EXPECT_DOUBLE_EQ(pinned(cm, 3).sharing(4), 1.5);
  EXPECT_EQ(pinned(cm, 1.5).sharing(4), 1.0);
  // launch_oversub (the layout search's price) is not scaled: the simulator charges what
  // the search paid.
  CostModel flat = cpu_host();
  flat.sync_wait_oversub_by_burst.clear();
  EXPECT_EQ(pinned(flat, 2).oversub_launch(4), flat.launch_oversub);
  EXPECT_EQ(pinned(flat, 2).sync_wait(1e-4, 2, 4), 0);
  // Within the cores the runnable count changes nothing.
  for (const double a : {0.0, 1.0, 2.0, 3.0}) {
    EXPECT_EQ(pinned(cm, a).sync_wait(1e-4, 2, 2), 1e-4);
    EXPECT_EQ(pinned(cm, a).runnable_weight(2), 0);
    EXPECT_EQ(pinned(cm, a).sharing(2), 1.0);
  }
}

// A second curve, measured at 8 ranks (weft calibrate's next probe world): past the first
// curve's 4 runnable the wait runs linearly in the runnable ranks to it, and stays there
// above 8. Not monotone in the ranks (here lower at 8 than at 4, as measured on 2 cores),
// which no weight on the first curve reaches. Below 4 runnable nothing changes.
TEST(Runnable, PastTheFirstCurvesRanksTheWaitRunsToTheCurveAtMore) {
  CostModel cm = cpu_host();
  cm.sync_wait_oversub_more_by_burst = {{1e-6, 4e-4}, {1.0, 4e-4}};
  cm.sync_wait_oversub_more_ranks = 8;
  EXPECT_EQ(cm.sync_wait(1e-4, 2, 8), 4e-4);  // every rank runnable: the curve at 8
  EXPECT_EQ(pinned(cm, 8).sync_wait(1e-4, 2, 8), 4e-4);
  EXPECT_DOUBLE_EQ(pinned(cm, 6).sync_wait(1e-4, 2, 8), 1e-3 + 0.5 * (4e-4 - 1e-3));
  EXPECT_DOUBLE_EQ(pinned(cm, 5).sync_wait(1e-4, 2, 8), 1e-3 + 0.25 * (4e-4 - 1e-3));
  EXPECT_EQ(pinned(cm, 4).sync_wait(1e-4, 2, 8), 1e-3);
  EXPECT_EQ(pinned(cm, 12).sync_wait(1e-4, 2, 16), 4e-4);  // clamped above the probe's 8
  EXPECT_EQ(cm.sync_wait(1e-4, 2, 4), 1e-3);                 // 4 ranks: the first curve
  const CostModel one = cpu_host();
  for (const double a : {1.0, 2.0, 3.0, 3.5}) {
    SCOPED_TRACE(a);
    EXPECT_EQ(pinned(cm, a).sync_wait(1e-4, 2, 8), pinned(one, a).sync_wait(1e-4, 2, 8));
    EXPECT_EQ(pinned(cm, a).sync_wait(1e-4, 2, 2), 1e-4);
  }
  EXPECT_EQ(pinned(one, 6).sync_wait(1e-4, 2, 8), 1e-3);  // without it: the first curve

  // dp2 x tp2 x pp2 at 8 ranks, simulated (the runnable ranks found by the fixed point):
  // the step under the lower curve at 8 is below the one under the first curve alone, by
  // no more than what every collective would save at the whole difference.
  const core::JobSpec s = job(2, 2, 2);
  const core::ModelGraph mg = build_planning_graph(s);
  const Plan p = plan_unsimulated(s, mg, 8);
  const CostAnnotations with = simulate_plan(p, mg.graph, cm), without = simulate_plan(p, mg.graph, one);
  ASSERT_GT(without.step_s, 0);
  EXPECT_LT(with.step_s, without.step_s);
  EXPECT_GT(with.step_s, without.step_s - 0.5 * double(p.roles.at(0).program.size()) * 6e-4);
}

TEST(Runnable, HardwareFileAndPlanJsonCarryTheCurveAtMoreRanks) {
  Hardware hw = load_hardware("h100");
  hw.cores = 2;
  hw.sync_wait_oversub_by_burst = {{1.3e-4, 2.9e-3}, {1.1e-3, 1.3e-3}};
  hw.sync_wait_oversub_ranks = 4;
  hw.sync_wait_oversub_more_by_burst = {{5e-5, 1.6e-3}, {2e-3, 2.9e-3}};
  hw.sync_wait_oversub_more_ranks = 8;
  const Hardware back = hardware_from_yaml(hardware_to_yaml(hw), "round trip");
  EXPECT_EQ(back.sync_wait_oversub_more_by_burst, hw.sync_wait_oversub_more_by_burst);
  EXPECT_EQ(back.cost_model().sync_wait_oversub_more_ranks, 8);
  EXPECT_EQ(back.cost_model().sync_wait_oversub_more_by_burst, hw.sync_wait_oversub_more_by_burst);

  const std::string base = hardware_to_yaml([] {
    Hardware h = load_hardware("h100");
    h.cores = 2;
    return h;
  }());
  auto err = [&](const std::string& extra) {
    return std::string(test_util::config_error([&] { hardware_from_yaml(base + extra, "t.yaml"); }).what());
  };
  const std::string first = "sync_wait_oversub_by_burst: [[1e-4, 3e-3]]\nsync_wait_oversub_ranks: 4\n";
  const std::string more = "sync_wait_oversub_more_by_burst: [[1e-4, 2e-3]]\n";
  EXPECT_NE(err(first + more).find("hardware.sync_wait_oversub_more_ranks: missing"), std::string::npos)
      << err(first + more);
  EXPECT_NE(err(first + more + "sync_wait_oversub_more_ranks: 4\n").find("must be more than sync_wait_oversub_ranks (4)"),
            std::string::npos);
  EXPECT_NE(err(more + "sync_wait_oversub_more_ranks: 8\n").find("must be more than sync_wait_oversub_ranks (0)"),
            std::string::npos);
  EXPECT_NE(err(first + "sync_wait_oversub_more_ranks: 8\n").find("given without sync_wait_oversub_more_by_burst"),
            std::string::npos);

  const core::JobSpec s = job(2, 2, 2);
  const core::ModelGraph mg = build_planning_graph(s);
  PlanOptions po;
  po.cost = cpu_host();
  po.cost.sync_wait_oversub_more_by_burst = {{1e-6, 4e-4}, {1.0, 4e-4}};
  po.cost.sync_wait_oversub_more_ranks = 8;
  const Plan p = make_plan(s, mg.graph, 8, po);
  const Plan back_plan = plan_from_json(plan_to_json(p));
  EXPECT_EQ(back_plan.costs.model.sync_wait_oversub_more_by_burst, po.cost.sync_wait_oversub_more_by_burst);
  EXPECT_EQ(back_plan.costs.model.sync_wait_oversub_more_ranks, 8);
  PlanOptions plain;
  EXPECT_EQ(plan_to_json(make_plan(s, mg.graph, 8, plain)).find("sync_wait_oversub_more"), std::string::npos);
}

// tp2 x pp2 on 2 cores: a stage waits for the other's activations and gradients, so the
// simulator's fixed point finds fewer than 4 runnable, and its step falls below the one with
// every rank runnable (the curve's whole wait and 2x sharing), above the one with 2.
TEST(Runnable, APipelineOverTheCoresRunsFewerRanksThanTheWorld) {
  const core::JobSpec s = job(1, 2, 2);
  const core::ModelGraph mg = build_planning_graph(s);
  const Plan p = plan_unsimulated(s, mg, 4);
  const CostAnnotations free = simulate_plan(p, mg.graph, cpu_host());
  const CostAnnotations all = simulate_plan(p, mg.graph, pinned(cpu_host(), 4));
  const CostAnnotations two = simulate_plan(p, mg.graph, pinned(cpu_host(), 2));
  ASSERT_TRUE(free.valid && all.valid && two.valid);
  EXPECT_LT(free.step_s, all.step_s * 0.99);
  EXPECT_GT(free.step_s, two.step_s * 1.01);
  // Rank 0 (stage 0) spends part of the step waiting for stage 1's gradients.
  EXPECT_GT(free.ranks[0].recv_wait_s, 0);
}

// tp4 has no pipeline message to wait for: every rank is runnable all step, and the fixed
// point leaves the model where every rank counts (the step with active_ranks pinned at 4).
TEST(Runnable, WithoutAPipelineEveryRankIsRunnable) {
  const core::JobSpec s = job(1, 4, 1);
  const core::ModelGraph mg = build_planning_graph(s);
  const Plan p = plan_unsimulated(s, mg, 4);
  const CostAnnotations free = simulate_plan(p, mg.graph, cpu_host());
  const CostAnnotations all = simulate_plan(p, mg.graph, pinned(cpu_host(), 4));
  ASSERT_TRUE(free.valid && all.valid);
  EXPECT_NEAR(free.step_s, all.step_s, 1e-9 * all.step_s);
  for (const RankCost& rc : free.ranks) EXPECT_EQ(rc.recv_wait_s, 0);
}

// Within the cores nothing moves: world-2 layouts simulate to the same step whatever the
// oversubscribed curve, its probe's ranks or the runnable count say.
TEST(Runnable, WithinTheCoresTheSimulatorIgnoresIt) {
  for (const auto& [dp, tp, pp] : {std::tuple{2, 1, 1}, {1, 2, 1}, {1, 1, 2}}) {
    const core::JobSpec s = job(dp, tp, pp);
    const core::ModelGraph mg = build_planning_graph(s);
    const Plan p = plan_unsimulated(s, mg, 2);
    CostModel none = cpu_host();
    none.sync_wait_oversub_by_burst.clear();
    none.sync_wait_oversub_ranks = 0;
    EXPECT_EQ(simulate_plan(p, mg.graph, cpu_host()).step_s, simulate_plan(p, mg.graph, none).step_s)
        << dp << " " << tp << " " << pp;
  }
}

// The stage model's estimate: a stage is busy m (f + b) of the pipeline's (m + pp - 1)
// (f + b) (GPipe and 1F1B with backward = 2 forward), so 4 ranks of pp 2 at 4
// micro-batches are 4 x 4/5 runnable; nothing to estimate within the cores, without a
// pipeline or on GPUs.
TEST(Runnable, TheStageModelEstimatesTheRunnableRanksFromTheSchedule) {
  const CostModel cm = cpu_host();
  EXPECT_NEAR(schedule_runnable(cm, 4, "gpipe", 2, 1, 4), 3.2, 1e-12);
  EXPECT_NEAR(schedule_runnable(cm, 4, "1f1b", 2, 1, 4), 3.2, 1e-12);
  EXPECT_NEAR(schedule_runnable(cm, 8, "1f1b", 4, 1, 1), 8.0 / 4.0, 1e-12);
  EXPECT_EQ(schedule_runnable(cm, 2, "1f1b", 2, 1, 4), 0);
  EXPECT_EQ(schedule_runnable(cm, 4, "1f1b", 1, 1, 4), 0);
  EXPECT_EQ(schedule_runnable(CostModel{}, 64, "1f1b", 4, 1, 4), 0);
}

// The search prices a pipeline candidate over the cores with that estimate (its
// prediction is predict() under it), below the one with every rank runnable; within the
// cores its candidates and predictions are those of a model without the oversubscribed terms.
TEST(Runnable, TheSearchPricesAPipelinesWaitsAtItsRunnableRanks) {
  core::JobSpec s = job(1, 2, 2);
  s.parallel.plan = "search";
  s.train.micro_batch = 1;
  SearchOptions so;
  so.cost = cpu_host();
  const SearchResult r = search_plan(s, 4, so);
  ASSERT_FALSE(r.top.empty());
  const Layout& l = r.top[0].layout;
  ASSERT_EQ(l.deg.pp, 2);
  const core::ModelGraph mg = build_planning_graph(s);
  const Crossing cross = crossing(l.deg, test_util::kStageOrder, so.cost.ranks_per_node);
  const double runnable = schedule_runnable(so.cost, 4, l.schedule, 2, int(l.virtual_stages),
                                            int(l.micro_batches));
  ASSERT_GT(runnable, 2.0);
  ASSERT_LT(runnable, 4.0);
  const std::vector<int64_t> flight =
      stage_in_flight(l.schedule, 2, int(l.virtual_stages), int(l.micro_batches));
  auto predicted = [&](const CostModel& cm) {
    const SplitCosts sc = split_costs(mg.graph, cm, s.train.global_batch, 2, 1, l.micro_batch, cross,
                                      l.sequence_parallel);
    return predict(s.model, sc, l, cm, cross, flight).step_s;
  };
  EXPECT_DOUBLE_EQ(r.top[0].pred.step_s, predicted(pinned(so.cost, runnable)));
  EXPECT_LT(r.top[0].pred.step_s, predicted(so.cost) * 0.99);  // every rank runnable

  core::JobSpec two = test_util::gpt_spec(2, 64, 4, 256, 16);
  two.parallel.plan = "search";
  two.parallel.dp = two.parallel.tp = two.parallel.pp = 0;
  SearchOptions none = so;
  none.cost.sync_wait_oversub_by_burst.clear();
  none.cost.sync_wait_oversub_ranks = 0;
  const SearchResult a = search_plan(two, 2, so), b = search_plan(two, 2, none);
  ASSERT_EQ(a.top.size(), b.top.size());
  for (size_t i = 0; i < a.top.size(); ++i) EXPECT_EQ(a.top[i].pred.step_s, b.top[i].pred.step_s);
}

TEST(Runnable, HardwareFileAndPlanJsonCarryTheProbesRanks) {
  Hardware hw = load_hardware("h100");
  hw.cores = 2;
  hw.sync_wait_oversub_by_burst = {{1.3e-4, 2.9e-3}, {1.1e-3, 1.3e-3}};
  hw.sync_wait_oversub_ranks = 4;
  const Hardware back = hardware_from_yaml(hardware_to_yaml(hw), "round trip");
  EXPECT_EQ(back.sync_wait_oversub_ranks, 4);
  EXPECT_EQ(back.cost_model().sync_wait_oversub_ranks, 4);
  EXPECT_EQ(hardware_to_yaml(load_hardware("h100")).find("sync_wait_oversub_ranks"), std::string::npos);

  const std::string base = hardware_to_yaml(load_hardware("h100"));
  auto err = [&](const std::string& extra) {
    return std::string(test_util::config_error([&] { hardware_from_yaml(base + extra, "t.yaml"); }).what());
  };
  const std::string curve = "sync_wait_oversub_by_burst: [[1e-4, 3e-3]]\n";
  EXPECT_NE(err(curve + "sync_wait_oversub_ranks: 2.5\n").find("hardware.sync_wait_oversub_ranks"),
            std::string::npos);
  EXPECT_NE(err(curve + "sync_wait_oversub_ranks: 1\n").find("hardware.sync_wait_oversub_ranks"),
            std::string::npos);
  EXPECT_NE(err("sync_wait_oversub_ranks: 4\n").find("given without sync_wait_oversub_by_burst"),
            std::string::npos);
  const std::string cores4 = hardware_to_yaml([] {
    Hardware h = load_hardware("h100");
    h.cores = 4;
    return h;
  }());
  EXPECT_NE(std::string(test_util::config_error([&] {
              hardware_from_yaml(cores4 + curve + "sync_wait_oversub_ranks: 4\n", "t.yaml");
            }).what())
                .find("must be more than cpu.cores (4)"),
            std::string::npos);

  const core::JobSpec s = job(1, 2, 2);
  const core::ModelGraph mg = build_planning_graph(s);
  PlanOptions po;
  po.cost = cpu_host();
  const Plan p = make_plan(s, mg.graph, 4, po);
  const std::string json = plan_to_json(p);
  EXPECT_EQ(plan_from_json(json).costs.model.sync_wait_oversub_ranks, 4);
  PlanOptions plain;
  EXPECT_EQ(plan_to_json(make_plan(s, mg.graph, 4, plain)).find("sync_wait_oversub_ranks"),
            std::string::npos);
  std::string bad = json;
  const std::string key = "\"sync_wait_oversub_ranks\":4";
  const size_t at = bad.find(key);
  ASSERT_NE(at, std::string::npos);
  bad.replace(at, key.size(), "\"sync_wait_oversub_ranks\":1.5");
  try {
    plan_from_json(bad);
    ADD_FAILURE() << "a fractional sync_wait_oversub_ranks was read";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("costs.model.sync_wait_oversub_ranks"), std::string::npos);
  }
}

}  // namespace
}  // namespace weft::planner
