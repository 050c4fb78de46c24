// CostModel::replica_drift: data-parallel replicas drift apart by the waits their ranks pay
// on their own groups and messages, and a collective across replicas waits for the last of
// them. What the model does with it: the expected maximum of the replicas' drifts, the
// engine's charge of it at the collectives across replicas (once per step, in part at each),
// its re-timing and its one-replica run alike, and nothing where the replicas pay no wait
// apart.
#include <gtest/gtest.h>

#include <cmath>

#include "planner/engine.h"
#include "planner/planner.h"
#include "planner/simulate.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {

// A host with cores enough for every rank (the within-cores curve prices every call), on
// one node, waiting `w` at every synchronisation whatever the burst.
CostModel flat_waits(double w, int cores = 8) {
  CostModel cm;
  cm.cores = cores;
  cm.ranks_per_node = 1 << 20;
  if (w > 0) cm.sync_wait_by_burst = {{1e-6, w}, {1.0, w}};
  return cm;
}

Plan plan_of(int dp, int tp, int pp, const core::ModelGraph& mg, core::JobSpec s) {
  s.parallel.dp = dp, s.parallel.tp = tp, s.parallel.pp = pp;
  PlanOptions po;
  po.simulate = false;
  return make_plan(s, mg.graph, dp * tp * pp, po);
}

TEST(ReplicaDrift, TheExpectedMaximumAndItsVariance) {
  // E[max] and Var[max] of n standard normals.
  EXPECT_EQ(CostModel::expected_max(1), 0);
  EXPECT_NEAR(CostModel::expected_max(2), 1 / std::sqrt(M_PI), 1e-4);
  EXPECT_NEAR(CostModel::expected_max(4), 1.02938, 1e-4);
  EXPECT_NEAR(CostModel::expected_max(8), 1.42360, 1e-4);
  EXPECT_NEAR(CostModel::max_variance(2), 1 - 1 / M_PI, 1e-4);
  EXPECT_NEAR(CostModel::max_variance(4), 0.49172, 1e-4);
  // Above 8, Blom's approximation: E[max] of 16 and of 100 are 1.76599 and 2.50759; the
  // variance falls as 1 / ln n from 8's (of 16: 0.2797, exact 0.2950).
  EXPECT_NEAR(CostModel::max_variance(16), 0.2950, 0.2950 * 0.06);
  EXPECT_NEAR(CostModel::expected_max(16), 1.76599, 1.76599 * 0.005);
  EXPECT_NEAR(CostModel::expected_max(100), 2.50759, 2.50759 * 0.005);
  for (int n = 2; n < 64; ++n) {
    EXPECT_LT(CostModel::expected_max(n), CostModel::expected_max(n + 1)) << n;  // a later last
    EXPECT_GT(CostModel::max_variance(n), CostModel::max_variance(n + 1)) << n;  // a surer one
  }
}

TEST(ReplicaDrift, TheDriftFromTheWaits) {
  CostModel cm;
  // A pair's wait w is e(2) sigma: its exit varies by v(2) sigma^2; a group of 4's, e(4)
  // sigma and v(4) sigma^2.
  const double w = 1e-3, sigma = w / CostModel::expected_max(2);
  EXPECT_NEAR(cm.wait_variance(w, 2), CostModel::max_variance(2) * sigma * sigma, 1e-18);
  const double sigma4 = w / CostModel::expected_max(4);
  EXPECT_NEAR(cm.wait_variance(w, 4), CostModel::max_variance(4) * sigma4 * sigma4, 1e-18);
  EXPECT_EQ(cm.wait_variance(w, 1), 0);  // a group of one waits for no one
  EXPECT_EQ(cm.wait_variance(0, 2), 0);
  // A drift of variance var costs e(k) sqrt(var) at a collective across k replicas.
  const double var = 4e-6;
  EXPECT_EQ(cm.replica_drift(var, 1), 0);  // one replica waits for no other
  EXPECT_EQ(cm.replica_drift(0, 2), 0);    // replicas that paid no wait apart
  EXPECT_NEAR(cm.replica_drift(var, 2), 2e-3 / std::sqrt(M_PI), 1e-7);
  EXPECT_NEAR(cm.replica_drift(var, 4), 2e-3 * 1.02938, 1e-7);
  // The spread scales the variance; 0 is the model without the drift.
  cm.wait_spread = 2;
  EXPECT_NEAR(cm.wait_variance(w, 2), 4 * CostModel::max_variance(2) * sigma * sigma, 1e-18);
  cm.wait_spread = 0;
  EXPECT_EQ(cm.wait_variance(w, 2), 0);
}

TEST(ReplicaDrift, AGroupSpansTheReplicasOfItsRanks) {
  const core::JobSpec s = test_util::gpt_spec(2, 64, 4, 256, 16);
  const core::ModelGraph mg = build_planning_graph(s);
  const Plan p = plan_of(2, 2, 1, mg, s);
  const std::vector<int> replicas = replicas_per_group(p);
  ASSERT_EQ(replicas.size(), p.groups.size());
  int across = 0, within = 0;
  for (const ProcessGroup& g : p.groups) {
    const bool all_dp = p.families.at(size_t(g.family)).all_dp;
    EXPECT_EQ(replicas[size_t(g.id)], all_dp && g.ranks.size() > 1 ? 2 : 1) << "group " << g.id;
    (replicas[size_t(g.id)] > 1 ? across : within)++;
  }
  EXPECT_GT(across, 0);  // the gradient buckets'
  EXPECT_GT(within, 0);  // the tensor-parallel pairs'
}

// dp 2 alone: the replicas synchronise only with each other, so they pay no wait apart and
// never drift; the step is the model's without the drift, bit for bit.
TEST(ReplicaDrift, ReplicasThatPayNoWaitApartDoNotDrift) {
  const core::JobSpec s = test_util::gpt_spec(2, 64, 4, 256, 16);
  const core::ModelGraph mg = build_planning_graph(s);
  const Plan p = plan_of(2, 1, 1, mg, s);
  CostModel with = flat_waits(3e-4), without = with;
  without.wait_spread = 0;
  EXPECT_EQ(simulate_plan(p, mg.graph, with).step_s, simulate_plan(p, mg.graph, without).step_s);
}

// dp 2 x tp 2: each replica's pair pays the flat wait w at each of its own calls, and its
// exit varies by v(2) (w / e(2))^2; the gradient buckets, across the replicas, pay e(2) x
// the square root of that sum over the calls before them in all (a bucket pays what the ones
// before it did not), so the step grows by that at the last bucket's count, on every rank.
// With no curve at all nothing drifts.
TEST(ReplicaDrift, BucketsPayTheDriftOfTheCallsEachReplicaMadeApart) {
  const core::JobSpec s = test_util::gpt_spec(2, 64, 4, 256, 16);
  const core::ModelGraph mg = build_planning_graph(s);
  const Plan p = plan_of(2, 2, 1, mg, s);
  const std::vector<int> replicas = replicas_per_group(p);
  const double w = 4e-4;
  CostModel with = flat_waits(w), without = with;
  without.wait_spread = 0;
  int apart = 0, buckets = 0;
  double due = 0;
  for (const Instr& in : p.roles.at(size_t(p.role_index(0))).program) {
    if (in.kind != InstrKind::kCollective) continue;
    if (replicas[size_t(p.group_id(in.group, 0))] > 1) {
      ++buckets;
      due = CostModel{}.replica_drift(double(apart) * CostModel{}.wait_variance(w, 2), 2);
    } else {
      ++apart;
    }
  }
  ASSERT_GT(buckets, 0);
  ASSERT_GT(apart, 8);
  // The buckets come last: e(2) x sqrt(calls x v(2)) x sigma, sigma = w / e(2).
  EXPECT_NEAR(due, w * std::sqrt(double(apart) * CostModel::max_variance(2)), w * 0.3);
  const CostAnnotations a = simulate_plan(p, mg.graph, with),
                        b = simulate_plan(p, mg.graph, without);
  ASSERT_EQ(a.ranks.size(), 4u);
  for (size_t r = 0; r < a.ranks.size(); ++r) {
    EXPECT_NEAR(a.ranks[r].step_s - b.ranks[r].step_s, due, 1e-12) << "rank " << r;
    EXPECT_NEAR(a.ranks[r].comm_s - b.ranks[r].comm_s, due, 1e-12) << "rank " << r;
  }
  const CostModel gpu = flat_waits(0);
  CostModel gpu_still = gpu;
  gpu_still.wait_spread = 0;
  EXPECT_EQ(simulate_plan(p, mg.graph, gpu).step_s, simulate_plan(p, mg.graph, gpu_still).step_s);
}

// The drift through pipeline messages and every engine path: dp 2 x pp 2 and dp 2 x tp 2 x
// pp 2 (messages carry the sender's drift to its receiver), run with every replica, with
// replica 0 alone, and re-timed from a run recorded under another model: the same numbers.
TEST(ReplicaDrift, EveryReplicaOneReplicaAndRetimeAgree) {
  const core::JobSpec s = test_util::gpt_spec(2, 64, 4, 256, 16);
  const core::ModelGraph mg = build_planning_graph(s);
  const CostModel cost = flat_waits(3e-4), recorded = flat_waits(1e-4);
  CostModel still = cost;
  still.wait_spread = 0;
  for (const auto& [tp, pp] : std::vector<std::pair<int, int>>{{1, 2}, {2, 2}}) {
    SCOPED_TRACE("dp2 tp" + std::to_string(tp) + " pp" + std::to_string(pp));
    const Plan p = plan_of(2, tp, pp, mg, s);
    EngineOptions all, one;
    all.cost = one.cost = &cost;
    one.one_replica = true;
    const EngineResult a = run_programs(p, mg.graph, all), b = run_programs(p, mg.graph, one);
    ASSERT_TRUE(a.errors.empty() && b.errors.empty());
    EngineSchedule schedule;
    EngineOptions rec;
    rec.cost = &recorded;
    rec.record = &schedule;
    const EngineResult checked = run_programs(p, mg.graph, rec);
    const EngineResult c = retime(p, mg.graph, schedule, checked, all);
    EngineOptions plain = all;
    plain.cost = &still;
    const EngineResult d = run_programs(p, mg.graph, plain);
    double grew = 0;
    for (size_t r = 0; r < a.ranks.size(); ++r) {
      EXPECT_EQ(a.ranks[r].step_s, b.ranks[r].step_s) << "rank " << r;
      EXPECT_DOUBLE_EQ(a.ranks[r].step_s, c.ranks[r].step_s) << "rank " << r;
      EXPECT_DOUBLE_EQ(a.ranks[r].comm_s, c.ranks[r].comm_s) << "rank " << r;
      grew = std::max(grew, a.ranks[r].step_s - d.ranks[r].step_s);
    }
    // Each replica's stages wait at their messages (and pairs) apart: the buckets pay a drift.
    EXPECT_GT(grew, 0.1 * 3e-4);
  }
}

}  // namespace
}  // namespace weft::planner
