// A restart round while a node departs (issue 14): node 2 of three leaves (SIGTERM) under
// ZeRO-1, its move into epoch 2 stands still (WEFT_TEST_STALL_MOVE), and during the stall node
// 0's worker is SIGKILLed while the store refuses every renewal (WEFT_TEST_REFUSE_RENEWAL).
// At MIN nodes (--nnodes 2:3, two members left) the worker cannot be replaced in place, so
// node 0's agent asks for restart round 1 of epoch 2: every node's workers restart in it, and
// its world counts node 2's as departing ones (epoch 2 still lists node 2: its hand-over was
// never confirmed). Node 2's agent restarts its worker in the round as a departing one, which
// hands over there and ends; node 2's agent exits 0 and the others train to the end with one
// process's numbers. Before, node 2's agent followed epochs only: its worker never entered the
// round's world, which waited for it (here far beyond the test's patience: the waits are set
// to 600 s, so such a hang fails the test). Nothing is stored (no snapshots, no checkpoints)
// and the killed worker took its third of Adam's moments, so the round starts over from step
// 0. Real processes, real signals; every process is reaped however the test ends.
#include <gtest/gtest.h>
#include <signal.h>

#include <string>
#include <vector>

#include "tests/support/live_job.h"

namespace weft::test {
namespace {

using namespace live;

TEST(LiveResizeLeaveRound, ARestartRoundDuringAHandOverRestartsTheLeaverWhichHandsOverAndExits) {
  LiveJob job;
  job.dir = agent_test_dir("live_resize_leave_round", "nothing");
  job.id = "live-leave-round-" + std::to_string(::getpid());
  job.nnodes = "2:3";
  job.steps = 200;
  job.max_restarts = 1;
  job.sets = {"parallel.dp=auto", "parallel.zero=1"};
  const fs::path ref = reference_run(job.dir, job.steps, job.sets);
  job.env = {"WEFT_TEST_STALL_MOVE=2:50", "WEFT_ROUTER_BUDGET_BYTES=65536",
             "WEFT_RESIZE_TIMEOUT_MS=600000", "WEFT_COMM_TIMEOUT_MS=600000",
             "WEFT_TEST_REFUSE_RENEWAL=1"};
  ASSERT_NO_FATAL_FAILURE(job.start_in_order(3));
  ASSERT_TRUE(job.wait_steps(20)) << job.all_logs();
  const std::vector<pid_t> node0 = children(job.pid(0)), node1 = children(job.pid(1));
  ASSERT_EQ(node0.size(), 1u) << job.all_logs();
  ::kill(job.pid(2), SIGTERM);  // epoch 2: nodes 0 and 1, node 2 departing
  ASSERT_TRUE(job.wait_line_anywhere("the move stops after")) << job.all_logs();
  ASSERT_EQ(::kill(node0[0], SIGKILL), 0);
  job.expect_exits({2, 0, 1});

  // Node 0 could not renew epoch 2 and asked for the round; nodes 1 and 2 restarted in it.
  EXPECT_EQ(job.lines_with(0, "the store refused the renewal (WEFT_TEST_REFUSE_RENEWAL)").size(),
            1u)
      << job.text(0);
  const std::vector<std::string> restarted =
      job.lines_with(1, "restarting the workers (1 of --max-restarts 1 used)");
  ASSERT_EQ(restarted.size(), 1u) << job.text(1);
  EXPECT_NE(restarted[0].find("restart round 1 asked for by node"), std::string::npos)
      << restarted[0];
  EXPECT_NE(children(job.pid(1)), node1);
  // The round's world counts the leaver: three ranks, two of which train, from step 0.
  EXPECT_EQ(job.lines_with(0,
                           "restart 2 (membership epoch 2, world 3): checkpoint.every is 0 "
                           "(no checkpoints): starting over from step 0")
                .size(),
            1u)
      << job.text(0);
  EXPECT_EQ(job.lines_with(2, "restarting the workers as departing ones").size(), 1u)
      << job.text(2);
  // The leaver's restarted worker handed over in the round's world (nobody needed its state:
  // the round starts over) and its agent left with exit 0.
  EXPECT_EQ(job.lines_with(2,
                           "rank 2 of epoch 2 left the job after handing its state over "
                           "(nobody needed it: the others start over from step 0)")
                .size(),
            1u)
      << job.text(2);
  EXPECT_EQ(job.lines_with(2, "left the job; its workers handed their state over").size(), 1u)
      << job.text(2);
  const std::vector<std::pair<WorldEpoch, int>> p = job.phases();
  ASSERT_EQ(p.size(), 1u) << phases_text(p);  // the metrics of a start over begin anew
  EXPECT_EQ(p[0], std::make_pair(WorldEpoch(2, 2), job.steps)) << phases_text(p);
  expect_same_losses(ref, job.metrics(), size_t(job.steps), false, kRelDp);
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);
}

}  // namespace
}  // namespace weft::test
