// A node that joins a live job with in-memory snapshots (snapshot.every: 1, redundancy
// replica) takes the lowest free node rank, and its node index in the epoch it joins is that
// rank. A departing node whose hand-over is not yet confirmed frees its rank while its
// weft run and its snapshot agent still live: here node 2 of three leaves (SIGTERM) and its
// move into epoch 2 stands still (WEFT_TEST_STALL_MOVE), so the newcomer of epoch 3 gets
// rank 2, the index the leaver's agent was started under on this machine. The newcomer's
// snapshot agent must be its own (not the leaver's, whose lock and socket it would find), hold
// its predecessor's replicas, and the run must equal one process's. Real processes, real
// signals; every process and segment is reaped however the test ends. No timing thresholds.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <string>

#include "checkpoint/job_id.h"
#include "checkpoint/snapshot_segment.h"
#include "tests/support/live_job.h"
#include "tests/support/metrics_compare.h"
#include "tests/support/snapshot_leftovers.h"

namespace weft::test {
namespace {

using namespace live;

TEST(LiveResizeJoinSnapshots, ANewcomerGivenALeaversRankStartsItsOwnSnapshotAgent) {
  LiveJob job;
  job.dir = agent_test_dir("live_resize_join_snapshots", "replica");
  job.id = "live-join-snap-" + std::to_string(::getpid());
  job.nnodes = "2:3";
  job.steps = 300;
  job.sets = {"parallel.dp=auto", "parallel.zero=1", "snapshot.every=1",
              "snapshot.redundancy=replica"};
  job.env = {"WEFT_TEST_STALL_MOVE=2:50", "WEFT_ROUTER_BUDGET_BYTES=65536"};
  SnapshotLeftovers segments{checkpoint::job_id_for_run(job.id)};
  const fs::path ref = reference_run(job.dir, job.steps, {"parallel.dp=auto", "parallel.zero=1"});
  job.start_in_order(3);
  ASSERT_TRUE(job.wait_steps(20)) << job.all_logs();
  ::kill(job.pid(2), SIGTERM);  // epoch 2: nodes 0 and 1, node 2 departing (rank 2 free)
  ASSERT_TRUE(job.wait_line_anywhere("the move stops after")) << job.all_logs();
  const int newcomer = job.start();  // epoch 3: it gets rank 2 while the leaver still runs
  ASSERT_TRUE(job.wait_world(3, 20, 3)) << phases_text(job.phases()) << job.all_logs();
  EXPECT_EQ(job.lines_with(newcomer, " is node 2 of 3 (").size(), 1u) << job.text(newcomer);
  // Its own agent took its lock: none found another agent of the job serving its name.
  EXPECT_TRUE(job.lines_with(newcomer, "another agent serves job").empty()) << job.all_logs();
  // Its weft run told its own agent the ring: the newcomer holds node 1's replicas.
  const std::string held = "holding replicas of node 1's rank 1 (epoch 3)";
  ASSERT_TRUE(poll_until([&] { return !job.lines_with(newcomer, held).empty(); }))
      << job.all_logs();
  // And the leaver's agent never did: it was gone from the ring of epoch 3.
  EXPECT_TRUE(job.lines_with(2, held).empty()) << job.all_logs();
  std::optional<int> left = job.wait(2);
  ASSERT_TRUE(left) << job.all_logs();
  EXPECT_EQ(*left, 0) << job.text(2);
  job.expect_exits({0, 1, newcomer});
  expect_same_losses(ref, job.metrics(), size_t(job.steps), false, kRelDp);
  EXPECT_TRUE(checkpoint::snapshot_segments(segments.job).empty());
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);
}

}  // namespace
}  // namespace weft::test
