// A worker fails while a node is still handing its state over (issue 14): node 2 of three
// leaves (SIGTERM) under ZeRO-1, its move into epoch 2 stands still (WEFT_TEST_STALL_MOVE),
// and during the stall node 0's worker is SIGKILLed. With a restart left, its agent replaces
// it in place (not a restart round: every live worker keeps its process): epoch 3 renews
// epoch 2's members and still lists node 2 as departed (its hand-over was never confirmed),
// so node 2's agent posts epoch 3 to its worker and epoch 3's first world has three ranks on
// every side: node 1's worker, node 0's replacement and the leaver. The killed worker took
// the only live copy of its third of Adam's moments, so that world resumes from what exists
// (the node agents' in-memory snapshots; with none and no checkpoint, from step 0), the
// leaver ends once it handed over there, and every agent exits 0 with one process's numbers.
// Both waits a world that waited on an untold worker would fall into (the move's and the
// next notice's) are set far beyond the test's patience, so such a hang fails the test
// instead of recovering late. Real processes, real signals; every process and segment is
// reaped however the test ends.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <optional>
#include <regex>
#include <string>

#include "checkpoint/job_id.h"
#include "tests/support/live_job.h"
#include "tests/support/snapshot_leftovers.h"

namespace weft::test {
namespace {

using namespace live;

const char* const kMoveStopped = "the move stops after";

// The scenario above; `sets` beyond ZeRO-1 (where the state comes from). The job has ended
// when it returns, for the caller's checks of where epoch 3 took its state from.
void kill_a_worker_during_a_hand_over(LiveJob& job, const std::string& name,
                                      const std::vector<std::string>& sets) {
  job.dir = agent_test_dir("live_resize_handround", name);
  job.id = "live-handround-" + name + "-" + std::to_string(::getpid());
  job.nnodes = "2:3";
  job.steps = 200;
  job.max_restarts = 1;
  job.sets = {"parallel.dp=auto", "parallel.zero=1"};
  const fs::path ref = reference_run(job.dir, job.steps, job.sets);
  job.sets.insert(job.sets.end(), sets.begin(), sets.end());
  job.env = {"WEFT_TEST_STALL_MOVE=2:50", "WEFT_ROUTER_BUDGET_BYTES=65536",
             "WEFT_RESIZE_TIMEOUT_MS=600000", "WEFT_COMM_TIMEOUT_MS=600000"};
  job.start_in_order(3);
  ASSERT_TRUE(job.wait_steps(20)) << job.all_logs();
  const std::vector<pid_t> node0 = children(job.pid(0)), node1 = children(job.pid(1));
  ASSERT_EQ(node0.size(), 1u) << job.all_logs();
  ::kill(job.pid(2), SIGTERM);  // epoch 2: nodes 0 and 1, node 2 departing
  ASSERT_TRUE(job.wait_line_anywhere(kMoveStopped)) << job.all_logs();
  ASSERT_EQ(::kill(node0[0], SIGKILL), 0);
  ASSERT_TRUE(job.wait_world(2, 10, 3)) << phases_text(job.phases()) << job.all_logs();
  EXPECT_EQ(children(job.pid(1)), node1) << "node 1's worker keeps its process";
  job.expect_exits({2, 0, 1});
  EXPECT_EQ(job.lines_with(0, "replaced in place (1 of --max-restarts 1 used)").size(), 1u)
      << job.text(0);
  // The leaver's world of epoch 2 was replaced before it formed; it handed over in epoch 3's.
  EXPECT_EQ(job.lines_with(2, "world of epoch 2 not entered").size(), 1u) << job.text(2);
  EXPECT_EQ(job.lines_with(2, "rank 2 of epoch 3 left the job after handing its state over").size(),
            1u)
      << job.text(2);
  EXPECT_EQ(job.lines_with(2, "left the job; its workers handed their state over").size(), 1u)
      << job.text(2);
  for (int k : {0, 1, 2})
    EXPECT_TRUE(job.lines_with(k, "world of epoch 3 not entered").empty()) << job.text(k);
  const std::string all = job.all_logs();
  EXPECT_EQ(all.find("restarting the workers"), std::string::npos) << all;
  const std::vector<std::pair<WorldEpoch, int>> p = job.phases();
  ASSERT_FALSE(p.empty());
  EXPECT_EQ(p.back().first, WorldEpoch(2, 3)) << phases_text(p);
  expect_same_losses(ref, job.metrics(), size_t(job.steps), false, kRelDp);
}

// The replacement's third of the moments comes from its node's snapshot agent (a worker's
// death leaves it running), the others' from theirs: epoch 3 resumes at the step the stall
// held, not from the start.
TEST(LiveResizeHandRound, AWorkerKilledDuringAHandOverIsReplacedAndResumesFromSnapshots) {
  // Before the job: its segments go once its agents are reaped.
  SnapshotLeftovers segments{
      checkpoint::job_id_for_run("live-handround-snapshots-" + std::to_string(::getpid()))};
  LiveJob job;
  ASSERT_NO_FATAL_FAILURE(kill_a_worker_during_a_hand_over(
      job, "snapshots", {"snapshot.every=1", "snapshot.redundancy=replica"}));
  // The replacement (the lead) says where epoch 3 resumed: at least its own rank's third
  // comes from a snapshot; the other ranks' thirds come from theirs or live, as the holders'
  // vote finds them. Past the 20 steps trained before the leave, not from the start.
  const std::string resumed = job.only_line(0, "resumed at step ");
  static const std::regex re(
      R"(resumed at step (\d+) from the in-memory snapshots of ([123]) ranks)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(resumed, m, re)) << resumed;
  EXPECT_GE(std::stoi(m[1]), 20) << resumed;
  EXPECT_EQ(job.all_logs().find("starting over"), std::string::npos) << job.all_logs();
  EXPECT_EQ(job.lines_with(2, "the world resumes from in-memory snapshots").size(), 1u)
      << job.text(2);
  const std::vector<std::pair<WorldEpoch, int>> p = job.phases();
  ASSERT_EQ(p.size(), 2u) << phases_text(p);
  EXPECT_EQ(p[0].first, WorldEpoch(3, 1)) << phases_text(p);
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);
}

// Without snapshots or checkpoints nothing holds that third any more: epoch 3's world (the
// leaver in it all the same) starts over from step 0 and trains the whole job.
TEST(LiveResizeHandRound, AWorkerKilledDuringAHandOverWithNothingStoredStartsOverAndEnds) {
  LiveJob job;
  ASSERT_NO_FATAL_FAILURE(kill_a_worker_during_a_hand_over(job, "nothing", {}));
  EXPECT_EQ(
      job.lines_with(0, "checkpoint.every is 0 (no checkpoints): starting over from step 0").size(),
      1u)
      << job.text(0);
  EXPECT_EQ(job.lines_with(2, "the world starts over from step 0").size(), 1u) << job.text(2);
  const std::vector<std::pair<WorldEpoch, int>> p = job.phases();
  ASSERT_EQ(p.size(), 1u) << phases_text(p);  // the metrics of a start over begin anew
  EXPECT_EQ(p[0], std::make_pair(WorldEpoch(2, 3), job.steps)) << phases_text(p);
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);
}

}  // namespace
}  // namespace weft::test
