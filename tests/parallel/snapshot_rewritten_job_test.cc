// A snapshot slot rewritten while a live move reads it in place (issue 15), in a real job:
// three loopback nodes under ZeRO-1 over dp3, snapshot.redundancy replica, a snapshot every
// 50 steps. Node 2 dies whole; the survivors' live state lacks rank 2's shard, so the world of
// two resumes from the snapshots of one step (rank 2's from its replica on node 0) and moves
// them from their slots through the router. Rank 0 rewrites the first slot it read right
// after its move's first message (WEFT_TEST_REWRITE_SNAPSHOT, launch/snapshot_rewrite_for_tests.h):
// every rank must refuse the moved state (the reader naming the segment, slot and step, the
// other naming the reader), exit, be replaced by its agent within --max-restarts, and the new
// workers must resume from the snapshots of that same step (the hook committed the read
// snapshot again before a writer took its slot; the replaced workers hold no live state) with
// one process's numbers. Real processes, real signals; every process and segment is reaped
// however the test ends. No timing thresholds.
#include <gtest/gtest.h>

#include <cstdio>
#include <regex>
#include <string>
#include <vector>

#include "checkpoint/job_id.h"
#include "tests/support/live_job.h"
#include "tests/support/snapshot_leftovers.h"
#include "tests/support/snapshot_steps.h"

namespace weft::test {
namespace {

using namespace live;

// How the hook rewrites the slot: a writer left in it, or a newer snapshot committed there.
class SnapshotRewrittenJob : public ::testing::TestWithParam<std::string> {};

TEST_P(SnapshotRewrittenJob, EveryRankRefusesTheMoveAndTheReplacedWorkersResumeFromTheSnapshots) {
  const std::string how = GetParam();
  LiveJob job;
  job.dir = agent_test_dir("snapshot_rewritten_job", how);
  job.id = "snaprw-" + how + "-" + std::to_string(::getpid());
  job.nnodes = "2:3";
  job.max_restarts = 1;
  job.steps = 200;
  job.sets = {"parallel.dp=auto", "parallel.zero=1", "snapshot.redundancy=replica",
              "snapshot.every=50"};
  // Epoch 2 is the world of two that forms once node 2 is lost.
  job.env = {"WEFT_TEST_REWRITE_SNAPSHOT=2:0:" + how};
  SnapshotLeftovers segments{checkpoint::job_id_for_run(job.id)};
  const fs::path ref = reference_run(job.dir, job.steps, {"parallel.dp=auto"});
  job.start_in_order(3);
  const std::string replica =
      checkpoint::segment_name(segments.job, checkpoint::SegmentKind::kReplica, 2, 1, 2);
  // Rank 2's first snapshot is on node 0 (its replica) and a few steps have followed it.
  ASSERT_TRUE(poll_until([&] { return newest_step(replica) >= 50; })) << job.all_logs();
  ASSERT_TRUE(job.wait_steps(size_t(newest_step(replica)) + 5)) << job.all_logs();
  ASSERT_NO_FATAL_FAILURE(job.kill_whole(2));
  job.expect_exits({0, 1});

  // What the hook did on rank 0: which slot of which segment, holding which step.
  const std::string rewrote = job.only_line(0, "(WEFT_TEST_REWRITE_SNAPSHOT)");
  std::smatch m;
  const std::regex re(R"(snapshot slot (\d+) of (\S+) \(step (\d+)\) rewritten after the move's)");
  ASSERT_TRUE(std::regex_search(rewrote, m, re)) << rewrote;
  const std::string slot = m[1], segment = m[2], step = m[3];
  EXPECT_GE(std::stol(step), 50) << rewrote;
  // Every rank of the move refused it, the reader naming the slot, the other the reader;
  // each worker exited with that error and its agent replaced it within --max-restarts.
  const std::string reader = "snapshot slot " + slot + " of " + segment + " (step " + step +
                             ") was rewritten after it was verified: the state moved from it "
                             "(kept here or sent to other ranks) may not be the verified one";
  const std::string other =
      "a snapshot slot read by rank(s) 0 was rewritten during the move: the state received "
      "from it may not be the verified one";
  const std::string said[2] = {reader, other};
  for (int k = 0; k < 2; ++k) {
    const std::string rank = std::to_string(k);
    EXPECT_EQ(job.lines_with(k, "[rank " + rank + "] weft train: failed: " + said[k]).size(), 1u)
        << job.text(k);
    const std::string replaced = job.only_line(k, "weft run: rank " + rank + " (pid ");
    EXPECT_NE(replaced.find("exited with code 1: " + said[k] +
                            "; replaced in place (1 of --max-restarts 1 used)"),
              std::string::npos)
        << job.text(k);
  }
  // The new workers hold nothing live: the world resumed from the in-memory snapshots of the
  // step the refused move had chosen (the hook committed its snapshot again before it took the
  // slot), not from a checkpoint (the job has none) or step 0.
  const std::string resumed = job.only_line(0, "resumed at step ");
  EXPECT_NE(resumed.find("resumed at step " + step +
                         " from the in-memory snapshots of 3 ranks (world 3, epoch 1; 2 own, 1 "
                         "replica) through the router"),
            std::string::npos)
      << resumed;
  EXPECT_EQ(job.text(0).find("starting over from step 0"), std::string::npos) << job.text(0);
  expect_losses_by_step(ref, job.metrics(), kRelDp);
  EXPECT_TRUE(checkpoint::snapshot_segments(segments.job).empty());
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);
}

INSTANTIATE_TEST_SUITE_P(Rewrites, SnapshotRewrittenJob, ::testing::Values("torn", "committed"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           return std::string(i.param == "torn" ? "AWriterStillInIt"
                                                                : "ANewerSnapshot");
                         });

}  // namespace
}  // namespace weft::test
