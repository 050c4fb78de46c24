// The engine's two fast paths against the full runs they stand for: retime() of a recorded
// schedule against a run under the new cost model (every number bit for bit), and
// validate_plan's replica-0 run against a run of every rank (the same verdict and memory,
// on valid and on broken plans).
#include <gtest/gtest.h>

#include <algorithm>

#include "planner/engine.h"
#include "planner/validate.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {

struct Layout {
  int world, tp, pp, ep, zero;
  std::string schedule;
};

const std::vector<Layout> kLayouts = {{4, 1, 1, 1, 0, "1f1b"},  {8, 2, 2, 1, 1, "1f1b"},
                                      {8, 1, 2, 1, 3, "gpipe"}, {16, 2, 2, 1, 2, "interleaved"},
                                      {8, 1, 1, 2, 1, "1f1b"},  {16, 2, 2, 2, 0, "1f1b"}};

struct Planned {
  core::ModelGraph mg;
  Plan plan;
};

Planned plan_of(const Layout& c) {
  core::JobSpec s = c.ep > 1 ? test_util::moe_spec(4, 2) : test_util::gpt_spec(4);
  s.train.global_batch = 32;
  s.parallel.tp = c.tp, s.parallel.pp = c.pp, s.parallel.ep = c.ep, s.parallel.zero = c.zero;
  s.parallel.pipeline.schedule = c.schedule;
  if (c.schedule == "interleaved") s.parallel.pipeline.virtual_stages = 2;
  Planned p{build_planning_graph(s), {}};
  PlanOptions po;
  po.simulate = false;
  p.plan = make_plan(s, p.mg.graph, c.world, po);
  return p;
}

std::string name(const Layout& c) {
  return "world " + std::to_string(c.world) + " tp" + std::to_string(c.tp) + " pp" +
         std::to_string(c.pp) + " ep" + std::to_string(c.ep) + " zero" + std::to_string(c.zero) +
         " " + c.schedule;
}

void expect_same(const EngineResult& a, const EngineResult& b) {
  ASSERT_EQ(a.ranks.size(), b.ranks.size());
  EXPECT_EQ(a.fb_end, b.fb_end);
  for (size_t r = 0; r < a.ranks.size(); ++r) {
    const RankCost &x = a.ranks[r], &y = b.ranks[r];
    EXPECT_EQ(x.step_s, y.step_s) << "rank " << r;
    EXPECT_EQ(x.compute_s, y.compute_s) << "rank " << r;
    EXPECT_EQ(x.comm_s, y.comm_s) << "rank " << r;
    EXPECT_EQ(x.wait_s, y.wait_s) << "rank " << r;
    EXPECT_EQ(x.bubble, y.bubble) << "rank " << r;
    EXPECT_EQ(x.peak_bytes, y.peak_bytes) << "rank " << r;
    EXPECT_EQ(x.p2p_bytes, y.p2p_bytes) << "rank " << r;
    for (int k = 0; k < kCollKinds; ++k)
      EXPECT_EQ(x.comm_bytes[k], y.comm_bytes[k]) << "rank " << r;
    ASSERT_EQ(a.timeline.size(), b.timeline.size());
    if (a.timeline.empty()) continue;
    ASSERT_EQ(a.timeline[r].size(), b.timeline[r].size()) << "rank " << r;
    for (size_t i = 0; i < a.timeline[r].size(); ++i) {
      EXPECT_EQ(a.timeline[r][i].start, b.timeline[r][i].start) << "rank " << r << " span " << i;
      EXPECT_EQ(a.timeline[r][i].end, b.timeline[r][i].end) << "rank " << r << " span " << i;
    }
  }
}

TEST(EngineRetime, GivesTheNumbersOfARunUnderTheNewCostModel) {
  for (const Layout& c : kLayouts) {
    SCOPED_TRACE(name(c));
    Planned p = plan_of(c);
    // Recorded under one model, priced under another whose every term differs (nodes of 2
    // ranks: some groups and transfers cross nodes that did not before).
    CostModel before, after;
    after.flops = 3e13, after.launch = 4e-5, after.alpha_intra = 3e-6, after.bw_intra = 5e10;
    after.alpha_inter = 2e-5, after.bw_inter = 1e10, after.ranks_per_node = 2;
    after.cores = 1, after.active_ranks = 1.5, after.op_overhead = 1e-5,
    after.launch_oversub = 1e-4;
    for (bool one_replica : {false, true}) {
      EngineSchedule schedule;
      EngineOptions rec;
      rec.cost = &before;
      rec.one_replica = one_replica;
      rec.record = &schedule;
      const EngineResult checked = run_programs(p.plan, p.mg.graph, rec);
      ASSERT_TRUE(checked.errors.empty());
      ASSERT_FALSE(schedule.steps.empty());
      EngineOptions opt;
      opt.cost = &after;
      opt.one_replica = one_replica;
      opt.timeline = true;
      const EngineResult full = run_programs(p.plan, p.mg.graph, opt);
      const EngineResult fast = retime(p.plan, p.mg.graph, schedule, checked, opt);
      EXPECT_NE(full.fb_end, checked.fb_end);  // the new model changes the times
      expect_same(full, fast);
    }
  }
}

bool verdicts_agree(const Plan& plan, const core::Graph& g, int64_t budget) {
  EngineOptions every;
  every.memory_budget = budget;
  const EngineResult full = run_programs(plan, g, every);
  const ValidationReport fast = validate_plan(plan, g, budget);
  EXPECT_EQ(full.errors.empty(), fast.ok);
  EXPECT_EQ(fast.ok, fast.errors.empty());
  if (!full.errors.empty() || !fast.ok) return !fast.ok;
  EXPECT_EQ(full.ranks.size(), fast.peak_bytes.size());
  for (size_t r = 0; r < full.ranks.size() && r < fast.peak_bytes.size(); ++r)
    EXPECT_EQ(full.ranks[r].peak_bytes, fast.peak_bytes[r]) << "rank " << r;
  return !fast.ok;
}

TEST(ValidateReplicaZero, SameVerdictAsEveryRankOnValidAndBrokenPlans) {
  for (const Layout& c : kLayouts) {
    SCOPED_TRACE(name(c));
    Planned p = plan_of(c);
    ASSERT_GT(p.plan.mesh.degrees().dp, 1);
    EXPECT_FALSE(verdicts_agree(p.plan, p.mg.graph, 0));

    // Broken copies: a send dropped, a collective moved before the one it followed, a
    // memory budget a byte under the peak, a free of a tensor that lives on.
    const size_t last = p.plan.roles.size() - 1;
    Plan no_send = p.plan;
    for (Role& role : no_send.roles) {
      auto& prog = role.program;
      auto it = std::find_if(prog.begin(), prog.end(),
                             [](const Instr& i) { return i.kind == InstrKind::kSend; });
      if (it == prog.end()) continue;
      prog.erase(it);
      EXPECT_TRUE(verdicts_agree(no_send, p.mg.graph, 0));
      break;
    }
    Plan swapped = p.plan;
    auto& prog = swapped.roles[last].program;
    std::vector<size_t> colls;
    for (size_t i = 0; i < prog.size(); ++i)
      if (prog[i].kind == InstrKind::kCollective) colls.push_back(i);
    ASSERT_GE(colls.size(), 2u);
    std::swap(prog[colls.front()], prog[colls.back()]);
    EXPECT_TRUE(verdicts_agree(swapped, p.mg.graph, 0));

    const ValidationReport ok = validate_plan(p.plan, p.mg.graph);
    const int64_t peak = *std::max_element(ok.peak_bytes.begin(), ok.peak_bytes.end());
    EXPECT_TRUE(verdicts_agree(p.plan, p.mg.graph, peak - 1));
    EXPECT_FALSE(verdicts_agree(p.plan, p.mg.graph, peak));

    Plan early_free = p.plan;
    Instr free;
    free.kind = InstrKind::kFree;
    for (size_t t = 0; t < early_free.roles[0].tensors.size(); ++t)
      if (!early_free.roles[0].tensors[t].persistent) {
        free.in = {{-1, int(t)}};
        break;
      }
    early_free.roles[0].program.insert(early_free.roles[0].program.begin(), free);
    EXPECT_TRUE(verdicts_agree(early_free, p.mg.graph, 0));
  }
}

TEST(ValidateReplicaZero, AGroupEditedByHandIsCheckedOnEveryRank) {
  Planned p = plan_of({8, 1, 1, 1, 0, "1f1b"});  // dp 8: one data-parallel group of all ranks
  Plan edited = p.plan;
  // Replica 1's rank leaves the group: its gradient all-reduce then names a group without it.
  ProcessGroup* all = nullptr;
  for (ProcessGroup& g : edited.groups)
    if (g.ranks.size() == 8) all = &g;
  ASSERT_NE(all, nullptr);
  all->ranks.erase(all->ranks.begin() + 1);
  EXPECT_TRUE(verdicts_agree(edited, p.mg.graph, 0));
}

}  // namespace
}  // namespace weft::planner
