// snapshot.redundancy: ec with k=2, m=1 over three nodes under ZeRO-3 (every shard held once),
// then two losses in turn (issue 15). Node 1 dies whole: its shard is rebuilt from parity and
// the job trains on as two nodes, fewer than k + m, whose snapshots are still erasure-coded:
// one group of both with K = 1 (each node holds its peer's data as parity). Then node 2 dies
// whole: the lone survivor rebuilds its shard from epoch 2's parity and finishes with one
// process's numbers. Without the reduced epoch's parity the second loss finds that shard
// nowhere and the job goes back to the durable checkpoint or starts over. Real processes,
// real signals; every process and segment is reaped however the test ends. No timing
// thresholds.
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "checkpoint/job_id.h"
#include "checkpoint/snapshot_segment.h"
#include "tests/support/live_job.h"
#include "tests/support/metrics_compare.h"
#include "tests/support/snapshot_leftovers.h"

namespace weft::test {
namespace {

using namespace live;

// Whether agent `k`'s snapshot agent committed parity of `epoch` (its first, logged).
bool holds_parity_of(const LiveJob& job, int k, int epoch) {
  static const std::regex re(R"(holding parity fragment \d+ of stripe \d+ \(epoch (\d+)\))");
  for (const std::string& l : job.lines_with(k, "holding parity fragment")) {
    std::smatch m;
    if (std::regex_search(l, m, re) && std::stoi(m[1]) == epoch) return true;
  }
  return false;
}

TEST(LiveResizeEcTwoLosses, TwoNodesLeftStayCodedAndTheLoneSurvivorRebuildsFromTheirParity) {
  LiveJob job;
  job.dir = agent_test_dir("live_resize_ec_two_losses", "ec");
  job.id = "live-ec-two-losses-" + std::to_string(::getpid());
  job.nnodes = "1:3";
  job.steps = 300;
  job.sets = {"parallel.dp=auto",       "parallel.zero=3", "snapshot.every=1",
              "snapshot.redundancy=ec", "snapshot.ec.k=2", "snapshot.ec.m=1"};
  SnapshotLeftovers segments{checkpoint::job_id_for_run(job.id)};
  const fs::path ref = reference_run(job.dir, job.steps, {"parallel.dp=auto"});
  job.start_in_order(3);
  ASSERT_TRUE(job.wait_steps(20)) << job.all_logs();
  ASSERT_TRUE(poll_until([&] {
    return holds_parity_of(job, 0, 1) && holds_parity_of(job, 1, 1) && holds_parity_of(job, 2, 1);
  })) << job.all_logs();

  // The first loss: node 1 whole. Its shard is rebuilt from epoch 1's parity.
  ASSERT_NO_FATAL_FAILURE(job.kill_whole(1));
  ASSERT_TRUE(job.wait_world(2, 1, 2)) << phases_text(job.phases()) << job.all_logs();
  const std::string first = job.resize_line("epoch 1 -> 2");
  EXPECT_NE(first.find("world 3 -> 2"), std::string::npos) << job.all_logs();
  EXPECT_NE(first.find("in-memory snapshots (2 own, 1 rebuilt from parity)"), std::string::npos)
      << job.all_logs();
  // Epoch 2 has two nodes, fewer than k + m = 3: both agents and both weft runs say it is coded
  // as one group of both with K = 1, and both hold parity of it (their peer's).
  for (int k : {0, 2}) {
    EXPECT_TRUE(poll_until([&] {
      return !job.lines_with(k, "fewer than k + m = 3 nodes: its snapshots are erasure-coded "
                                "with ISA-L over one group of all 2 nodes with fewer data "
                                "fragments, K = 1")
                  .empty();
    })) << job.all_logs();
    EXPECT_FALSE(job.lines_with(k, "erasure-coded over one group of all 2 with K = 1 data + 1 "
                                   "parity fragment(s) per stripe")
                     .empty())
        << job.all_logs();
    EXPECT_TRUE(poll_until([&] { return holds_parity_of(job, k, 2); })) << job.all_logs();
    EXPECT_FALSE(job.lines_with(k, "epoch 2: this node holds its parity of 1/1 of its own").empty())
        << job.all_logs();
  }
  ASSERT_TRUE(job.wait_world(2, 20, 2)) << job.all_logs();

  // The second loss: node 2 whole. Agent 0, alone, rebuilds node 2's shard (its rank of epoch
  // 2) from the parity it holds, and finishes.
  ASSERT_NO_FATAL_FAILURE(job.kill_whole(2));
  job.expect_exits({0});
  const std::string second = job.resize_line("epoch 2 -> 3");
  EXPECT_NE(second.find("world 2 -> 1"), std::string::npos) << job.all_logs();
  EXPECT_NE(second.find("in-memory snapshots (1 own, 1 rebuilt from parity)"), std::string::npos)
      << job.all_logs();
  bool rebuilt = false;
  for (const std::string& l : job.lines_with(0, "rebuilt node 1's rank"))
    rebuilt = rebuilt || l.find("(epoch 2, step") != std::string::npos;
  EXPECT_TRUE(rebuilt) << job.all_logs();
  expect_same_losses(ref, job.metrics(), size_t(job.steps), false, kRelDp);
  EXPECT_TRUE(checkpoint::snapshot_segments(segments.job).empty());
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);
}

}  // namespace
}  // namespace weft::test
