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

// What the LossWatcher aborts in training (launch/train_ranks.cc): the world and
// communicators(). Under dp2 x tp2 rank 0's tensor-parallel group is a split of the world,
// which aborting the world does not reach. Rank 0 waits in that group's all-reduce for its
// partner, which never issues it (it stopped at the abort); aborting communicators() must end
// the wait with the abort, not leave it to the timeout (the wait is bounded by half of it).
TEST(ProcessGroups, AbortingTheirCommunicatorsEndsAWaitInASplitGroup) {
  LayoutCase lc;
  lc.config = "gpt-layout.yaml";
  lc.overrides = {"parallel.dp=2", "parallel.tp=2"};
  const core::JobSpec spec = layout_spec(lc);
  const planner::Plan plan = planner::make_plan(spec, 4);
  // Rank 0's group of two ranks that is not the world: a tensor-parallel one.
  int group = -1;
  for (const planner::ProcessGroup& g : plan.groups)
    if (g.ranks.size() == 2 && g.ranks[0] == 0) group = g.id;
  ASSERT_GE(group, 0) << "rank 0 is in no group of two";
  RunResult r = run_ranks(4, [&](RankContext& ctx) {
    const std::chrono::milliseconds timeout(60'000);
    RankWorld w = gloo_world(ctx, "abort", timeout);
    parallel::ProcessGroups groups(*w.comm, plan);
    if (ctx.rank() != 0) {
      w.store->wait({"rank0-done"}, timeout);
      return;
    }
    const std::vector<comm::Communicator*> comms = groups.communicators();
    EXPECT_NE(std::find(comms.begin(), comms.end(), &groups.group(group)), comms.end());
    core::Tensor t = core::Tensor::from_vector<float>({1}, {1.0f});
    comm::Work pending = groups.group(group).all_reduce(t);
    w.comm->abort("a member was lost");
    for (comm::Communicator* c : comms) c->abort("a member was lost");
    try {
      pending.wait(timeout / 2);
      ADD_FAILURE() << "the group's all-reduce succeeded without its partner";
    } catch (const TimeoutError& e) {
      ADD_FAILURE() << "the abort did not end the group's wait: " << e.what();
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("a member was lost"), std::string::npos) << e.what();
    }
    w.store->set_string("rank0-done", "1");
  });
  EXPECT_TRUE(r.ok()) << r.summary();
}

}  // namespace
}  // namespace weft::test
