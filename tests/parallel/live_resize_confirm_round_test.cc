// A restart round asked for while a leaver confirms its hand-over (issue 14): node 2 of three
// leaves (SIGTERM) under ZeRO-1 and its worker hands its state over in epoch 2's world; its
// agent then holds the confirmation until a restart round is asked, and a second more
// (WEFT_TEST_CONFIRM_AFTER_ROUND), while node 0's worker is SIGKILLed and the store refuses
// every renewal (WEFT_TEST_REFUSE_RENEWAL): at MIN nodes node 0's agent asks for restart round
// 1 of epoch 2 and reads the record for its world at once, the confirmation comes after. The
// round and the departing nodes it counts are one record (MembershipRecord::round), and a
// confirmation against a round older than the record's is refused: node 2's worker restarts in
// the round as a departing one and hands over there, whatever moment each agent reads the
// record at. Before, the confirmation went through: node 0's world of the round counted node
// 2's worker, which had ended, and an agent reading after the confirmation did not (waits set
// far beyond the test's patience, so such a hang fails the test). Real processes, real signals;
// every process is reaped however the test ends.
#include <gtest/gtest.h>
#include <signal.h>

#include <string>
#include <vector>

#include "tests/support/live_job.h"

namespace weft::test {
namespace {

using namespace live;

TEST(LiveResizeLeaveRound, AConfirmationAfterARoundWasAskedIsRefusedAndTheLeaverHandsOverInIt) {
  LiveJob job;
  job.dir = agent_test_dir("live_resize_leave_round", "confirm");
  job.id = "live-leave-round-confirm-" + std::to_string(::getpid());
  job.nnodes = "2:3";
  job.steps = 200;
  job.max_restarts = 1;
  job.sets = {"parallel.dp=auto", "parallel.zero=1"};
  const fs::path ref = reference_run(job.dir, job.steps, job.sets);
  job.env = {"WEFT_TEST_CONFIRM_AFTER_ROUND=1000", "WEFT_RESIZE_TIMEOUT_MS=600000",
             "WEFT_COMM_TIMEOUT_MS=600000", "WEFT_TEST_REFUSE_RENEWAL=1"};
  ASSERT_NO_FATAL_FAILURE(job.start_in_order(3));
  ASSERT_TRUE(job.wait_steps(20)) << job.all_logs();
  const std::vector<pid_t> node0 = children(job.pid(0)), node1 = children(job.pid(1));
  ASSERT_EQ(node0.size(), 1u) << job.all_logs();
  ::kill(job.pid(2), SIGTERM);  // epoch 2: nodes 0 and 1, node 2 departing
  ASSERT_TRUE(job.wait_line_anywhere("holds its hand-over confirmation until a restart round"))
      << job.all_logs();
  ASSERT_EQ(::kill(node0[0], SIGKILL), 0);
  job.expect_exits({2, 0, 1});

  EXPECT_EQ(job.lines_with(0, "the store refused the renewal (WEFT_TEST_REFUSE_RENEWAL)").size(),
            1u)
      << job.text(0);
  const std::vector<std::string> restarted =
      job.lines_with(1, "restarting the workers (1 of --max-restarts 1 used)");
  ASSERT_EQ(restarted.size(), 1u) << job.text(1);
  EXPECT_NE(restarted[0].find("restart round 1 asked for by node"), std::string::npos)
      << restarted[0];
  EXPECT_NE(children(job.pid(1)), node1);
  // The leaver's worker had handed over in epoch 2's world; the round's world replaced that
  // one, so its agent restarted it there as a departing one, and it handed over again.
  EXPECT_EQ(job.lines_with(2, "restarting the workers as departing ones").size(), 1u)
      << job.text(2);
  EXPECT_EQ(job.lines_with(2, "rank 2 of epoch 2 left the job after handing its state over").size(),
            1u)
      << job.text(2);
  EXPECT_EQ(job.lines_with(2, "left the job; its workers handed their state over").size(), 1u)
      << job.text(2);
  const std::string all = job.all_logs();
  EXPECT_EQ(all.find("WEFT_RESIZE_TIMEOUT_MS"), std::string::npos) << all;
  // Nothing stored, and the killed worker took its third of Adam's moments: the round's world
  // (three ranks, the leaver among them) starts over and trains the whole job.
  EXPECT_EQ(job.lines_with(0,
                           "restart 2 (membership epoch 2, world 3): checkpoint.every is 0 "
                           "(no checkpoints): starting over from step 0")
                .size(),
            1u)
      << job.text(0);
  const std::vector<std::pair<WorldEpoch, int>> p = job.phases();
  ASSERT_EQ(p.size(), 1u) << phases_text(p);  // the metrics of a start over begin anew
  EXPECT_EQ(p[0], std::make_pair(WorldEpoch(2, 2), job.steps)) << phases_text(p);
  expect_same_losses(ref, job.metrics(), size_t(job.steps), false, kRelDp);
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);
}

}  // namespace
}  // namespace weft::test
