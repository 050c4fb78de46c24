// The router with real processes: forked ranks over Gloo (127.0.0.1) move real bytes from
// one plan's layout to another's, with a budget small enough for many waves and rounds;
// every destination element must equal the value its global coordinates define.
#include <gtest/gtest.h>

#include "comm/registry.h"
#include "tests/parallel/router_util.h"
#include "tests/parallel/vps_util.h"
#include "tests/support/multiprocess.h"

namespace weft::parallel {
namespace {

using test_util::Degrees;
using test_util::fill;
using test_util::mismatches;
using test_util::plan_for;
using test_util::space_for;
using test_util::tiny_spec;

void run_pair(bool moe, Degrees from, Degrees to, int64_t budget) {
  core::JobSpec spec = tiny_spec(moe);
  StateSpace space = space_for(spec);
  Layout a = layout_of(space, plan_for(spec, from));
  Layout b = layout_of(space, plan_for(spec, to));
  const int world = std::max(a.world(), b.world());
  std::vector<int> ia(size_t(a.world())), ib(size_t(b.world()));
  for (size_t i = 0; i < ia.size(); ++i) ia[i] = int(i);
  for (size_t i = 0; i < ib.size(); ++i) ib[i] = int(i);
  a = remap_ranks(a, ia, world);
  b = remap_ranks(b, ib, world);
  RouterOptions opt;
  opt.budget_bytes = budget;
  const TransferPlan plan = transition(space, a, b, opt);
  ASSERT_GT(plan.bytes_remote(), 0);
  test::RunResult result = test::run_ranks(world, [&](test::RankContext& ctx) {
    auto store = ctx.store();
    comm::CommOptions o;
    o.rank = ctx.rank(), o.size = ctx.world(), o.store = store.get(), o.prefix = "router";
    o.timeout = std::chrono::milliseconds(30000);
    auto comm = comm::make_communicator(comm::BackendKind::kGloo, o);
    const int r = ctx.rank();
    std::vector<core::Tensor> src = allocate_locals(a.ranks[size_t(r)]);
    fill(space, a.ranks[size_t(r)], src);
    // Every rank derives the plan itself (no exchange): it must equal the parent's.
    TransferPlan mine = transition(space, a, b, opt);
    ASSERT_EQ(mine.transfers.size(), plan.transfers.size());
    std::vector<core::Tensor> dst = run_transition(mine, a, b, r, src, *comm);
    for (const core::Tensor& s : src)
      EXPECT_FALSE(s.defined()) << "sources are released wave by wave";
    EXPECT_EQ(mismatches(space, b.ranks[size_t(r)], dst), 0) << "rank " << r;
  });
  EXPECT_TRUE(result.ok()) << result.summary();
}

TEST(RouterExec, Dp2Tp2ToPp2Dp2MovesRealBytes) {
  run_pair(false, {2, 2, 1, 1, 0}, {2, 1, 2, 1, 0}, 8192);
}

TEST(RouterExec, Dp2Tp2ToDp4Zero1MovesRealBytes) {
  run_pair(false, {2, 2, 1, 1, 0}, {4, 1, 1, 1, 1}, 1 << 16);
}

TEST(RouterExec, FourRanksShrinkToOneProcess) { run_pair(false, {1, 4, 1, 1, 0}, {}, 1 << 20); }

TEST(RouterExec, MoeEp2GrowsToEp4) { run_pair(true, {1, 1, 1, 2, 0}, {1, 1, 1, 4, 0}, 1 << 14); }

}  // namespace
}  // namespace weft::parallel
