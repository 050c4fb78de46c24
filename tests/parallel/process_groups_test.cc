// ProcessGroups: which group families need a split of the world. Each split is an exchange
// over the world and, for a group of several ranks, a new Gloo connection mesh: 15-70 ms of
// every online resize on loopback. Every group's communicator must still reduce over exactly
// its members, in member order.
#include "parallel/process_groups.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "planner/planner.h"
#include "tests/parallel/layout_harness.h"
#include "tests/support/multiprocess.h"

namespace weft::test {
namespace {

// Which families need a split: data parallelism alone (one program on every rank) has its
// all-ranks group served by the world and its one-rank groups by loopback, so a world of 4
// splits nothing; tensor parallelism (two programs) splits as before.
void expect_groups(int world, const std::vector<std::string>& sets, bool dp_only) {
  LayoutCase lc;
  lc.config = "gpt-layout.yaml";
  lc.overrides = sets;
  const core::JobSpec spec = layout_spec(lc);
  const planner::Plan plan = planner::make_plan(spec, world);
  RunResult r = run_ranks(world, [&](RankContext& ctx) {
    RankWorld w = gloo_world(ctx, "g", std::chrono::milliseconds(30'000));
    parallel::ProcessGroups groups(*w.comm, plan);
    if (dp_only) {
      EXPECT_EQ(groups.splits(), 0);
      EXPECT_GE(groups.world_groups(), 1);
    } else {
      EXPECT_GT(groups.splits(), 0);
      EXPECT_EQ(groups.world_groups(), 0);
    }
    for (const planner::ProcessGroup& g : plan.groups) {
      const auto it = std::find(g.ranks.begin(), g.ranks.end(), ctx.rank());
      if (it == g.ranks.end()) continue;
      comm::Communicator& c = groups.group(g.id);
      EXPECT_EQ(c.size(), int(g.ranks.size()));
      EXPECT_EQ(c.rank(), int(it - g.ranks.begin()));
      // A sum over the group's members, through whichever communicator serves it.
      core::Tensor t = core::Tensor::from_vector<float>({1}, {float(ctx.rank() + 1)});
      c.all_reduce(t).wait();
      float want = 0;
      for (int m : g.ranks) want += float(m + 1);
      EXPECT_EQ(t.data<float>()[0], want) << "group " << g.id;
    }
  });
  EXPECT_TRUE(r.ok()) << r.summary();
}

TEST(ProcessGroups, DataParallelGroupsNeedNoSplit) { expect_groups(4, {"parallel.dp=4"}, true); }

TEST(ProcessGroups, TensorParallelGroupsAreSplit) {
  expect_groups(4, {"parallel.dp=2", "parallel.tp=2"}, false);
}

}  // namespace
}  // namespace weft::test
