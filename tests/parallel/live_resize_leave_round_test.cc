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
// to 600 s, so such a hang fails the test). The same round asked for while the leaver confirms
// its hand-over (WEFT_TEST_CONFIRM_AFTER_ROUND holds the confirmation until the round is
// asked): the round and the departing nodes it counts are one record
// (MembershipRecord::round), and a confirmation against an older round is refused, so node 2's
// worker restarts in the round and hands over there whatever moment each agent reads the
// record at; before, the confirmation went through and the round's world waited for a worker
// that had ended. Real processes, real signals; every process and segment is reaped however
// the test ends.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <regex>
#include <string>
#include <vector>

#include "checkpoint/job_id.h"
#include "tests/support/live_job.h"
#include "tests/support/snapshot_leftovers.h"

namespace weft::test {
namespace {

using namespace live;

// What holds node 2's hand-over open while node 0's worker is killed: the hooks, and the line
// that says they hold it.
struct Window {
  std::vector<std::string> env;
  std::string line;
};
// Its move into epoch 2 stands still: the hand-over is never confirmed.
const Window kStalledMove{{"WEFT_TEST_STALL_MOVE=2:50", "WEFT_ROUTER_BUDGET_BYTES=65536"},
                          "the move stops after"};
// It handed over; its confirmation waits until the round is asked, and a second more.
const Window kLateConfirmation{{"WEFT_TEST_CONFIRM_AFTER_ROUND=1000"},
                               "holds its hand-over confirmation until a restart round"};

// The scenario above; `sets` beyond ZeRO-1 (where the state comes from). The job has ended
// when it returns, for the caller's checks of where the round took its state from.
void restart_round_during_a_hand_over(LiveJob& job, const std::string& name,
                                      const std::vector<std::string>& sets,
                                      const Window& window = kStalledMove) {
  job.dir = agent_test_dir("live_resize_leave_round", name);
  job.id = "live-leave-round-" + name + "-" + std::to_string(::getpid());
  job.nnodes = "2:3";
  job.steps = 200;
  job.max_restarts = 1;
  job.sets = {"parallel.dp=auto", "parallel.zero=1"};
  const fs::path ref = reference_run(job.dir, job.steps, job.sets);
  job.sets.insert(job.sets.end(), sets.begin(), sets.end());
  job.env = window.env;
  job.env.insert(job.env.end(), {"WEFT_RESIZE_TIMEOUT_MS=600000", "WEFT_COMM_TIMEOUT_MS=600000",
                                 "WEFT_TEST_REFUSE_RENEWAL=1"});
  ASSERT_NO_FATAL_FAILURE(job.start_in_order(3));
  ASSERT_TRUE(job.wait_steps(20)) << job.all_logs();
  const std::vector<pid_t> node0 = children(job.pid(0)), node1 = children(job.pid(1));
  ASSERT_EQ(node0.size(), 1u) << job.all_logs();
  ::kill(job.pid(2), SIGTERM);  // epoch 2: nodes 0 and 1, node 2 departing
  ASSERT_TRUE(job.wait_line_anywhere(window.line)) << job.all_logs();
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
  EXPECT_EQ(job.lines_with(2, "restarting the workers as departing ones").size(), 1u)
      << job.text(2);
  // The leaver's restarted worker handed over in the round's world of epoch 2 (the round's
  // attempt: restart count (2 - 1) + 1) and its agent left with exit 0.
  EXPECT_EQ(job.lines_with(2, "rank 2 of epoch 2 left the job after handing its state over").size(),
            1u)
      << job.text(2);
  EXPECT_EQ(job.lines_with(2, "left the job; its workers handed their state over").size(), 1u)
      << job.text(2);
  const std::string all = job.all_logs();
  EXPECT_EQ(all.find("WEFT_RESIZE_TIMEOUT_MS"), std::string::npos) << all;
  expect_same_losses(ref, job.metrics(), size_t(job.steps), false, kRelDp);
}

// Nothing stored (no snapshots, no checkpoints), and the killed worker took its third of
// Adam's moments: the round's world (three ranks, the leaver among them) starts over.
void expect_the_round_starts_over_with_the_leaver(LiveJob& job) {
  EXPECT_EQ(job.lines_with(0,
                           "restart 2 (membership epoch 2, world 3): checkpoint.every is 0 "
                           "(no checkpoints): starting over from step 0")
                .size(),
            1u)
      << job.text(0);
  EXPECT_EQ(job.lines_with(2, "the world starts over from step 0").size(), 1u) << job.text(2);
  const std::vector<std::pair<WorldEpoch, int>> p = job.phases();
  ASSERT_EQ(p.size(), 1u) << phases_text(p);  // the metrics of a start over begin anew
  EXPECT_EQ(p[0], std::make_pair(WorldEpoch(2, 2), job.steps)) << phases_text(p);
}

TEST(LiveResizeLeaveRound, WithNothingStoredTheRoundStartsOverWithTheLeaverInItsWorld) {
  LiveJob job;
  ASSERT_NO_FATAL_FAILURE(restart_round_during_a_hand_over(job, "nothing", {}));
  expect_the_round_starts_over_with_the_leaver(job);
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);
}

// The leaver's workers handed over in epoch 2's world, and its confirmation comes only after
// node 0 asked for the round and read the record for its world: refused, so its worker
// restarts in the round as a departing one and hands over again there (nothing stored: the
// round's world of three starts over).
TEST(LiveResizeLeaveRound, AConfirmationAfterARoundWasAskedIsRefusedAndTheLeaverHandsOverInIt) {
  LiveJob job;
  ASSERT_NO_FATAL_FAILURE(
      restart_round_during_a_hand_over(job, "confirm", {}, kLateConfirmation));
  expect_the_round_starts_over_with_the_leaver(job);
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);
}

// Snapshots on every node, none replicated (snapshot.redundancy: none): the third of Adam's
// moments of the leaver's rank exists only in the leaver's node's snapshot agent, whose
// segments its restarted worker offers in the round's world. So the round resumes where the
// stall held the job, from the snapshots of all three ranks, not from step 0.
TEST(LiveResizeLeaveRound, TheLeaversRestartedWorkerHandsItsNodesSnapshotsOverInTheRound) {
  // Before the job: its segments go once its agents are reaped.
  SnapshotLeftovers segments{
      checkpoint::job_id_for_run("live-leave-round-snapshots-" + std::to_string(::getpid()))};
  LiveJob job;
  ASSERT_NO_FATAL_FAILURE(restart_round_during_a_hand_over(
      job, "snapshots", {"snapshot.every=1", "snapshot.redundancy=none"}));
  const std::string resumed = job.only_line(0, "resumed at step ");
  static const std::regex re(
      R"(restart 2 \(membership epoch 2, world 3\): resumed at step (\d+) from the in-memory )"
      R"(snapshots of 3 ranks \(world 3, epoch 1;)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(resumed, m, re)) << resumed;
  EXPECT_GE(std::stoi(m[1]), 20) << resumed;
  EXPECT_EQ(job.all_logs().find("starting over"), std::string::npos) << job.all_logs();
  const std::vector<std::pair<WorldEpoch, int>> p = job.phases();
  ASSERT_EQ(p.size(), 2u) << phases_text(p);
  EXPECT_EQ(p[0].first, WorldEpoch(3, 1)) << phases_text(p);
  EXPECT_EQ(p[1].first, WorldEpoch(2, 2)) << phases_text(p);
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);
}

// A round later in the epoch that a graceful leave formed, once the leaver has handed over and
// gone: epoch 2 lists it as departed when it forms, and no longer once its hand-over is
// confirmed (the record changes, the epoch does not). The round's world is the two members'
// only: before, an agent took the departing nodes of the epoch's formation, and the round's
// world waited for a worker that had ended.
TEST(LiveResizeLeaveRound, ARoundAfterAConfirmedHandOverDoesNotWaitForTheLeaver) {
  LiveJob job;
  job.dir = agent_test_dir("live_resize_leave_round", "after");
  job.id = "live-leave-round-after-" + std::to_string(::getpid());
  job.nnodes = "2:3";
  job.steps = 200;
  job.max_restarts = 1;
  job.sets = {"parallel.dp=auto", "parallel.zero=1"};
  const fs::path ref = reference_run(job.dir, job.steps, job.sets);
  job.env = {"WEFT_RESIZE_TIMEOUT_MS=600000", "WEFT_COMM_TIMEOUT_MS=600000",
             "WEFT_TEST_REFUSE_RENEWAL=1"};
  ASSERT_NO_FATAL_FAILURE(job.start_in_order(3));
  ASSERT_TRUE(job.wait_steps(20)) << job.all_logs();
  ::kill(job.pid(2), SIGTERM);
  job.expect_exits({2});
  ASSERT_TRUE(job.wait_world(2, 5, 2)) << phases_text(job.phases()) << job.all_logs();
  const std::vector<pid_t> node0 = children(job.pid(0));
  ASSERT_EQ(node0.size(), 1u) << job.all_logs();
  ASSERT_EQ(::kill(node0[0], SIGKILL), 0);
  job.expect_exits({0, 1});
  EXPECT_EQ(job.lines_with(2, "left the job; its workers handed their state over").size(), 1u)
      << job.text(2);
  const std::vector<std::string> restarted =
      job.lines_with(1, "restarting the workers (1 of --max-restarts 1 used)");
  ASSERT_EQ(restarted.size(), 1u) << job.text(1);
  EXPECT_NE(restarted[0].find("restart round 1 asked for by node"), std::string::npos)
      << restarted[0];
  EXPECT_EQ(job.lines_with(0,
                           "restart 2 (membership epoch 2, world 2): checkpoint.every is 0 "
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
