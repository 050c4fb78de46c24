// A node that joins a live job with in-memory snapshots (snapshot.every: 1, redundancy
// replica) takes the lowest free node rank, and its node index in the epoch it joins is that
// rank. A departing node whose hand-over is not yet confirmed frees its rank while its
// weft run and its snapshot agent still live: here node 2 of three leaves (SIGTERM) and its
// move into epoch 2 stands still (WEFT_TEST_STALL_MOVE), so the newcomer of epoch 3 gets
// rank 2, the index the leaver's agent was started under on this machine. The newcomer's
// weft run must start an agent of its own (not find the leaver's lock and socket) and tell it
// its place in epoch 3. Epoch 3's first world then forms with the leaver's worker in it (its
// node is still departing: the newcomer's worker, started in the epoch, must count it too,
// as the survivors' do) and trains to the end: the leaver hands its state over there and
// every agent exits 0, with one process's numbers; the leaver's snapshot agent removes the
// segments it held and nothing of the others'. Real processes, real signals; every
// process and segment is reaped however the test ends.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <string>

#include "checkpoint/job_id.h"
#include "checkpoint/snapshot_segment.h"
#include "tests/support/live_job.h"
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
  ASSERT_TRUE(poll_until([&] { return !job.lines_with(newcomer, " is node 2 of 3 (").empty(); }))
      << job.all_logs();
  // Its weft run told its own agent its place in epoch 3 (under the leaver's name, the
  // leaver's agent got it, and the newcomer's own agent failed its lock).
  const std::string told = "[snapshot-agent] epoch 3: this node is node 2 of 3;";
  ASSERT_TRUE(poll_until([&] { return !job.lines_with(newcomer, told).empty(); }))
      << job.all_logs();
  EXPECT_TRUE(job.lines_with(2, told).empty()) << job.text(2);
  EXPECT_TRUE(job.lines_with(newcomer, "another agent serves job").empty()) << job.text(newcomer);
  // The leaver's agent still runs under its own name: the newcomer's agent took another.
  EXPECT_EQ(job.lines_with(newcomer, "for job " + segments.job + " on node 2 ").size(), 0u)
      << job.text(newcomer);
  // Epoch 3's world forms (the survivors', the newcomer's and the leaver's workers agree on
  // its size) and trains: the leaver goes once it handed over, the others finish the job.
  ASSERT_TRUE(job.wait_world(3, 1, 3)) << phases_text(job.phases()) << job.all_logs();
  ASSERT_EQ(job.wait(2), std::optional<int>(0)) << job.all_logs();
  // The leaver's agent removed what it held (its snapshots are of no use once the others
  // hold its state) and nothing else: every segment of the job left is held by a live agent,
  // and the others, training on, still have theirs.
  ASSERT_FALSE(job.ended(0)) << "the job ended before its leaver: nothing left to look at";
  EXPECT_EQ(job.lines_with(2, "(its hand-over confirmed); removed the ").size(), 1u) << job.text(2);
  const std::vector<std::string> left = checkpoint::snapshot_segments(segments.job);
  EXPECT_FALSE(left.empty());
  for (const std::string& name : left) {
    try {
      const int owner = checkpoint::SnapshotSegment::open(name, false).owner_pid();
      EXPECT_EQ(::kill(owner, 0), 0) << name << " is held by pid " << owner << ", gone";
    } catch (const std::exception&) {  // removed meanwhile by a live agent's retirement
    }
  }
  job.expect_exits({0, 1, newcomer});
  for (int k : {0, 1, 2, newcomer})
    EXPECT_TRUE(job.lines_with(k, "world of epoch 3 not entered").empty()) << job.text(k);
  EXPECT_EQ(job.lines_with(2, "left the job; its workers handed their state over").size(), 1u)
      << job.text(2);
  const std::vector<std::pair<WorldEpoch, int>> phases = job.phases();
  ASSERT_FALSE(phases.empty());
  EXPECT_EQ(phases.back().first, WorldEpoch(3, 3)) << phases_text(phases);
  expect_same_losses(ref, job.metrics(), size_t(job.steps), false, kRelDp);
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);
}

}  // namespace
}  // namespace weft::test
