// snapshot.redundancy: ec with k=3, m=1 over four nodes under ZeRO-3 (every shard held once),
// then two losses in turn (issue 15). Node 1 dies whole: its shard is rebuilt from parity and
// the job trains on as three nodes, fewer than k + m, whose snapshots are still erasure-coded:
// one group of the three with K = 2. Then node 3 dies whole: the survivors rebuild its shard
// from epoch 2's parity and finish with one process's numbers. Without the reduced epoch's
// parity the second loss finds that shard nowhere and the job goes back to the durable
// checkpoint or starts over. (Two losses of three nodes cannot be the test: one node of two
// is no strict majority of its epoch, and the membership stops it, comm/elastic/quorum.h;
// two nodes coded with K = 1 are tests/scenario/snapshot_parity_test.cc's.) Real processes,
// real signals; every process and segment is reaped however the test ends. No timing
// thresholds.
#include <gtest/gtest.h>

#include <string>

#include "checkpoint/job_id.h"
#include "checkpoint/snapshot_segment.h"
#include "tests/support/live_job.h"
#include "tests/support/metrics_compare.h"
#include "tests/support/snapshot_leftovers.h"

namespace weft::test {
namespace {

using namespace live;

TEST(LiveResizeEcTwoLosses, ThreeNodesLeftStayCodedAndASecondLossIsRebuiltFromTheirParity) {
  LiveJob job;
  job.dir = agent_test_dir("live_resize_ec_two_losses", "ec");
  job.id = "live-ec-two-losses-" + std::to_string(::getpid());
  job.nnodes = "2:4";
  job.steps = 300;
  job.sets = {"parallel.dp=auto",       "parallel.zero=3", "snapshot.every=1",
              "snapshot.redundancy=ec", "snapshot.ec.k=3", "snapshot.ec.m=1"};
  SnapshotLeftovers segments{checkpoint::job_id_for_run(job.id)};
  const fs::path ref = reference_run(job.dir, job.steps, {"parallel.dp=auto"});
  job.start_in_order(4);
  ASSERT_TRUE(job.wait_steps(20)) << job.all_logs();
  ASSERT_TRUE(poll_until([&] {
    for (int k = 0; k < 4; ++k)
      if (!job.holds_parity_of(k, 1)) return false;
    return true;
  })) << job.all_logs();

  // The first loss: node 1 whole. Its shard is rebuilt from epoch 1's parity.
  ASSERT_NO_FATAL_FAILURE(job.kill_whole(1));
  ASSERT_TRUE(job.wait_world(3, 1, 2)) << phases_text(job.phases()) << job.all_logs();
  const std::string first = job.resize_line("epoch 1 -> 2");
  EXPECT_NE(first.find("world 4 -> 3"), std::string::npos) << job.all_logs();
  EXPECT_NE(first.find("in-memory snapshots (3 own, 1 rebuilt from parity)"), std::string::npos)
      << job.all_logs();
  // Epoch 2 has three nodes, fewer than k + m = 4: after 20 of its steps (a snapshot each),
  // every agent and weft run has said it is coded as one group of the three with K = 2, every
  // agent that its parity fits, with the numbers, and every agent holds parity of it.
  ASSERT_TRUE(job.wait_world(3, 20, 2)) << job.all_logs();
  for (int k : {0, 2, 3}) {
    EXPECT_FALSE(job.lines_with(k,
                                "fewer than k + m = 4 nodes: its snapshots are erasure-coded "
                                "with ISA-L over one group of all 3 nodes with fewer data "
                                "fragments, K = 2")
                     .empty())
        << job.all_logs();
    EXPECT_FALSE(job.lines_with(k,
                                "erasure-coded over one group of all 3 with K = 2 data + 1 "
                                "parity fragment(s) per stripe")
                     .empty())
        << job.all_logs();
    EXPECT_FALSE(job.lines_with(k, "epoch 2: this node holds its parity of 1/2 of its own").empty())
        << job.all_logs();
    EXPECT_TRUE(job.holds_parity_of(k, 2)) << job.all_logs();
  }

  // The second loss: node 3 whole (node 2 of epoch 2). Agent 0, the first survivor after it
  // in the group, rebuilds its shard from epoch 2's data and parity; agents 0 and 2 finish.
  ASSERT_NO_FATAL_FAILURE(job.kill_whole(3));
  job.expect_exits({0, 2});
  const std::string second = job.resize_line("epoch 2 -> 3");
  EXPECT_NE(second.find("world 3 -> 2"), std::string::npos) << job.all_logs();
  EXPECT_NE(second.find("in-memory snapshots (2 own, 1 rebuilt from parity)"), std::string::npos)
      << job.all_logs();
  bool rebuilt = false;
  for (const std::string& l : job.lines_with(0, "rebuilt node 2's rank"))
    rebuilt = rebuilt || l.find("(epoch 2, step") != std::string::npos;
  EXPECT_TRUE(rebuilt) << job.all_logs();
  expect_same_losses(ref, job.metrics(), size_t(job.steps), false, kRelDp);
  EXPECT_TRUE(checkpoint::snapshot_segments(segments.job).empty());
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);
}

}  // namespace
}  // namespace weft::test
