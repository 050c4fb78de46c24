// Transfer plans as properties: random layout pairs (uneven grids, flat shards, replicas,
// hosts) and real plan pairs (dp2 x tp2 -> pp2, -> one process, -> dp4 zero1; MoE ep2 ->
// ep4) all cover every destination element exactly once from the best source, keep the
// budget, and replay under blocking semantics without a wait cycle.
#include <gtest/gtest.h>

#include <random>

#include "tests/parallel/vps_util.h"

namespace weft::parallel {
namespace {

using test_util::check_plan;
using test_util::Degrees;
using test_util::plan_for;
using test_util::space_for;
using test_util::tiny_spec;

TEST(RouterProperties, RandomLayoutPairs) {
  std::mt19937_64 rng(2026);
  for (int iter = 0; iter < 300; ++iter) {
    StateSpace space = test_util::random_space(rng, 1 + int(rng() % 6));
    int world = 1 + int(rng() % 6), hosts = 1 + int(rng() % 3);
    Layout a = test_util::random_layout(rng, space, world, hosts);
    Layout b = test_util::random_layout(rng, space, world, hosts);
    RouterOptions opt;
    opt.budget_bytes = 64 + int64_t(rng() % 2048);
    TransferPlan plan = transition(space, a, b, opt);
    check_plan(space, a, b, plan, "iteration " + std::to_string(iter));
    if (::testing::Test::HasFailure()) return;
    // Deterministic: the same inputs give the same plan on every rank.
    TransferPlan again = transition(space, a, b, opt);
    ASSERT_EQ(again.transfers.size(), plan.transfers.size());
    for (size_t i = 0; i < plan.transfers.size(); ++i) {
      EXPECT_EQ(again.transfers[i].src, plan.transfers[i].src);
      EXPECT_EQ(again.transfers[i].start, plan.transfers[i].start);
    }
    EXPECT_EQ(again.rounds(), plan.rounds());
  }
}

TEST(RouterProperties, ReplayOfACycleCompletesAndAMalformedRoundDoesNot) {
  // Sanity of the checker itself: a round where every rank of a 3-cycle sends first
  // (what rank_ops must avoid) blocks forever under blocking semantics.
  std::mt19937_64 rng(1);
  StateSpace space = test_util::random_space(rng, 1);
  Layout a, b;
  a.ranks.resize(3), b.ranks.resize(3);
  TransferPlan plan;
  plan.budget_bytes = 1 << 20;
  plan.waves.emplace_back();
  plan.waves[0].rounds.emplace_back();
  for (int r = 0; r < 3; ++r)
    plan.waves[0].rounds[0].messages.push_back(Message{r, (r + 1) % 3, {}, 8});
  // rank_ops orders by the rule, so the honest replay succeeds...
  EXPECT_EQ(test_util::replay(plan, a, b), "");
  // ...and two messages from one sender in a round (which the rule forbids) cannot match.
  plan.waves[0].rounds[0].messages.push_back(Message{0, 2, {}, 8});
  EXPECT_NE(test_util::replay(plan, a, b), "");
}

TEST(RouterProperties, LocalCopiesWhenTheLayoutDoesNotChange) {
  core::JobSpec spec = tiny_spec();
  StateSpace space = space_for(spec);
  Layout a = layout_of(space, plan_for(spec, {2, 2, 1, 1, 0}));
  TransferPlan plan = transition(space, a, a);
  check_plan(space, a, a, plan, "identity");
  EXPECT_EQ(plan.bytes_remote(), 0);
  EXPECT_EQ(plan.rounds(), 0);
}

TEST(RouterProperties, PrefersTheSameHostThenSpreadsOverReplicas) {
  core::JobSpec spec = tiny_spec();
  StateSpace space = space_for(spec);
  // A: four data-parallel replicas on ranks 0..3; B: one process on rank 4 of a union of 8.
  Layout a = remap_ranks(layout_of(space, plan_for(spec, {4, 1, 1, 1, 0})), {0, 1, 2, 3}, 8);
  Layout b = remap_ranks(whole_layout(space), {4}, 8);
  a.hosts = b.hosts = {0, 0, 1, 1, 1, 2, 2, 2};  // rank 4 shares host 1 with ranks 2 and 3
  TransferPlan plan = transition(space, a, b);
  check_plan(space, a, b, plan, "dp4 -> one process on a shared host");
  std::vector<int64_t> sent(8, 0);
  for (const Transfer& t : plan.transfers) sent[size_t(t.src)] += t.bytes;
  EXPECT_EQ(sent[0] + sent[1], 0) << "ranks 0 and 1 are on another host";
  EXPECT_GT(sent[2], 0);
  EXPECT_GT(sent[3], 0);
  // Spread: the two same-host replicas share the load to within one tensor.
  int64_t largest = 0;
  for (const StateTensor& t : space.tensors())
    largest = std::max(largest, core::shape_numel(t.shape) * 4);
  EXPECT_LE(std::llabs(sent[2] - sent[3]), largest);
}

struct PairCase {
  std::string name;
  bool moe;
  Degrees from, to;
};

class RouterPlanPairs : public ::testing::TestWithParam<PairCase> {};

TEST_P(RouterPlanPairs, CoverExactlyOnceWithinBudgetWithoutWaitCycles) {
  const PairCase& c = GetParam();
  core::JobSpec spec = tiny_spec(c.moe);
  StateSpace space = space_for(spec);
  Layout a = layout_of(space, plan_for(spec, c.from));
  Layout b = layout_of(space, plan_for(spec, c.to));
  const int world = std::max(a.world(), b.world());
  std::vector<int> ia(size_t(a.world())), ib(size_t(b.world()));
  for (size_t i = 0; i < ia.size(); ++i) ia[i] = int(i);
  for (size_t i = 0; i < ib.size(); ++i) ib[i] = int(i);
  a = remap_ranks(a, ia, world);
  b = remap_ranks(b, ib, world);
  a.hosts = b.hosts = std::vector<int>(size_t(world), 0);
  for (int r = 0; r < world; ++r) a.hosts[size_t(r)] = b.hosts[size_t(r)] = r / 2;
  for (int64_t budget : {int64_t(4096), int64_t(64) << 10, int64_t(256) << 20}) {
    RouterOptions opt;
    opt.budget_bytes = budget;
    TransferPlan plan = transition(space, a, b, opt);
    check_plan(space, a, b, plan, c.name + " budget " + std::to_string(budget));
    if (budget == 4096) {
      EXPECT_GT(plan.waves.size(), 1u) << "a small budget must split the state into waves";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Pairs, RouterPlanPairs,
    ::testing::Values(PairCase{"dp2tp2_to_pp2", false, {2, 2, 1, 1, 0}, {1, 1, 2, 1, 0}},
                      PairCase{"dp2tp2_to_dp2pp2", false, {2, 2, 1, 1, 0}, {2, 1, 2, 1, 0}},
                      PairCase{"dp2tp2_to_single", false, {2, 2, 1, 1, 0}, {}},
                      PairCase{"dp2tp2_to_dp4_zero1", false, {2, 2, 1, 1, 0}, {4, 1, 1, 1, 1}},
                      PairCase{"dp4_zero1_to_tp4", false, {4, 1, 1, 1, 1}, {1, 4, 1, 1, 0}},
                      PairCase{"single_to_dp2tp2_zero3", false, {}, {2, 2, 1, 1, 3}},
                      PairCase{"moe_ep2_to_ep4", true, {1, 1, 1, 2, 0}, {1, 1, 1, 4, 0}},
                      PairCase{"moe_ep4_to_dp2ep2_zero1", true, {1, 1, 1, 4, 0}, {2, 1, 1, 2, 1}}),
    [](const auto& info) { return info.param.name; });

TEST(Router, MissingSourceIsAClearError) {
  core::JobSpec spec = tiny_spec();
  StateSpace space = space_for(spec);
  Layout a = whole_layout(space);
  a.ranks[0].boxes.erase(a.ranks[0].boxes.begin());  // the first parameter is nowhere
  Layout b = whole_layout(space);
  try {
    transition(space, a, b);
    FAIL() << "expected InternalError";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find(space.at(0).name), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace weft::parallel
