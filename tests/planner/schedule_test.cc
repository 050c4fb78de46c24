// Pipeline orderings: one rule gives GPipe, 1F1B and interleaved 1F1B; their in-flight
// counts and bubbles match the closed forms.
#include <gtest/gtest.h>

#include <array>
#include <set>

#include "planner/schedule.h"
#include "planner/simulate.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {

TEST(Schedule, OneF1BStageHoldsAtMostPpMinusIMicroBatches) {
  const int pp = 4, m = 8;
  for (int s = 0; s < pp; ++s) {
    std::vector<Unit> u = stage_schedule("1f1b", pp, 1, m, s);
    EXPECT_EQ(u.size(), size_t(2 * m));
    EXPECT_EQ(max_in_flight(u), pp - s) << "stage " << s;
    EXPECT_EQ(max_in_flight(stage_schedule("gpipe", pp, 1, m, s)), m);
  }
  // Fewer micro-batches than stages: the warm-up is capped.
  EXPECT_EQ(max_in_flight(stage_schedule("1f1b", 4, 1, 2, 0)), 2);
}

TEST(Schedule, BubbleIsPpMinusOneOverMPlusPpMinusOne) {
  for (auto [pp, m] : std::vector<std::pair<int, int>>{{2, 4}, {4, 8}, {4, 16}, {8, 8}}) {
    std::vector<double> f(size_t(pp), 1.0), b(size_t(pp), 2.0);
    for (const char* sched : {"1f1b", "gpipe"}) {
      ScheduleTiming t = time_schedule(sched, pp, 1, m, f, b);
      double ideal = double(pp - 1) / double(m + pp - 1);
      EXPECT_NEAR(t.makespan, double(m + pp - 1) * 3.0, 1e-9) << sched;
      for (double x : t.bubble) EXPECT_NEAR(x, ideal, 1e-12) << sched << " pp " << pp << " m " << m;
    }
  }
}

// Each stage's end: under 1F1B and GPipe the last backward runs from the last stage down,
// one backward apart; a drift variance only the last stage adds (its forwards, 1 each)
// reaches every stage whole, carried by the gradients it sends down (Boundaries, on a GPU:
// no message waits).
TEST(Schedule, EachStageEndsOneBackwardAfterTheNext) {
  for (auto [pp, m] : std::vector<std::pair<int, int>>{{2, 4}, {4, 8}}) {
    std::vector<double> f(size_t(pp), 1.0), b(size_t(pp), 2.0);
    for (const char* sched : {"1f1b", "gpipe"}) {
      const ScheduleTiming t = time_schedule(sched, pp, 1, m, f, b);
      ASSERT_EQ(t.end.size(), size_t(pp));
      for (int s = 0; s < pp; ++s)
        EXPECT_NEAR(t.end[size_t(s)], t.makespan - 2.0 * s, 1e-9) << sched << " stage " << s;
      const CostModel gpu;
      Boundaries drift;
      drift.cost = &gpu;
      drift.fwd_syncs = drift.bwd_syncs = std::vector<char>(size_t(pp), 0);
      drift.fwd_var = drift.bwd_var = std::vector<double>(size_t(pp), 0.0);
      drift.fwd_var.back() = 1.0;
      const ScheduleTiming d = time_schedule(sched, pp, 1, m, f, b, nullptr, &drift);
      ASSERT_EQ(d.drift_var.size(), size_t(pp));
      for (double e : d.drift_var) EXPECT_EQ(e, double(m)) << sched;
      EXPECT_EQ(d.makespan, t.makespan) << sched;  // messages cost nothing there
    }
  }
}

TEST(Schedule, InterleavedVisitsEveryUnitOnceAndShrinksTheBubble) {
  const int pp = 4, v = 2, m = 8;
  for (int s = 0; s < pp; ++s) {
    std::vector<Unit> u = stage_schedule("interleaved", pp, v, m, s);
    std::set<std::tuple<int, int, int>> seen;
    for (const Unit& x : u) {
      EXPECT_EQ(x.chunk % pp, s);
      EXPECT_TRUE(seen.insert({x.mb, x.chunk, int(x.dir)}).second);
    }
    EXPECT_EQ(seen.size(), size_t(2 * m * v));
  }
  // Megatron's closed form: the warm-up shrinks v-fold, bubble (pp-1)/(v*m + pp-1).
  for (auto [P, V, M] : std::vector<std::array<int, 3>>{{4, 2, 8}, {4, 2, 16}, {2, 3, 4}, {8, 2, 16}}) {
    std::vector<double> f(size_t(P * V), 0.5), b(size_t(P * V), 1.0);
    ScheduleTiming t = time_schedule("interleaved", P, V, M, f, b);
    for (double x : t.bubble) EXPECT_NEAR(x, double(P - 1) / double(V * M + P - 1), 1e-12);
    EXPECT_LT(t.bubble[0], double(P - 1) / double(M + P - 1));
  }
}

TEST(Schedule, RoleProgramsRunTheirStageSchedule) {
  for (const char* sched : {"gpipe", "1f1b", "interleaved"}) {
    core::JobSpec s = test_util::gpt_spec(8);
    s.train.global_batch = 16;
    s.parallel.pp = 4;
    s.parallel.pipeline.schedule = sched;
    s.parallel.pipeline.virtual_stages = std::string(sched) == "interleaved" ? 2 : 1;
    core::ModelGraph mg = build_planning_graph(s);
    Plan p = make_plan(s, mg.graph, 4);
    for (const Role& r : p.roles) {
      std::vector<Unit> seen;
      for (const Instr& in : r.program) {
        if (in.stage == Stage::kStep || in.kind != InstrKind::kCompute) continue;
        Unit u{in.mb, in.chunk, in.stage == Stage::kForward ? Dir::kForward : Dir::kBackward};
        if (seen.empty() || !(seen.back() == u)) seen.push_back(u);
      }
      EXPECT_EQ(seen, stage_schedule(sched, 4, int(p.config.virtual_stages), int(p.config.micro_batches), r.stage))
          << sched << " stage " << r.stage;
      if (std::string(sched) == "1f1b") {
        EXPECT_EQ(max_in_flight(seen), 4 - r.stage);
      }
    }
  }
}

TEST(Schedule, PlannedPipelineBubbleMatchesTheClosedForm) {
  // Layers dominate (wide, many heads; tiny vocabulary), communication is free: the
  // simulated bubble of a 1F1B plan approaches (pp-1)/(m+pp-1).
  core::JobSpec s = test_util::gpt_spec(8, 256, 8, 64, 64);
  s.train.global_batch = 16;
  s.train.micro_batch = 2;
  s.parallel.pp = 4;
  CostModel cm;
  cm.launch = cm.alpha_intra = cm.alpha_inter = 0;
  cm.bw_intra = cm.bw_inter = 1e30;
  cm.mem_bw = 1e30;
  PlanOptions opt;
  opt.cost = cm;
  Plan p = make_plan(s, 4, opt);
  double ideal = 3.0 / (8.0 + 3.0);
  EXPECT_NEAR(p.costs.bubble, ideal, 0.03);
  // The pipeline estimate agrees with the simulated step within a few percent.
  EXPECT_NEAR(p.costs.pipeline_estimate_s / p.costs.step_s, 1.0, 0.05);
}

}  // namespace
}  // namespace weft::planner
