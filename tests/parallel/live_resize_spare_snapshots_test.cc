// A spare of a job with in-memory snapshots (snapshot.every: 1, redundancy replica): its
// snapshot agent starts beside its parked worker at a guessed place (the last of a full
// membership). Node 1 of three dies whole (not the last, so the guess is wrong); once the
// spare is admitted, its agent must snapshot under the node index it really has, its replica
// must go to its real successor in the ring and its predecessor's replica come to it. Then
// the spare dies whole in turn: the survivors resume from its replica, with one process's
// numbers. Real processes, real signals; every process and segment is reaped however the
// test ends. No timing thresholds.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <regex>
#include <string>
#include <vector>

#include "checkpoint/job_id.h"
#include "checkpoint/snapshot_segment.h"
#include "tests/support/live_job.h"
#include "tests/support/metrics_compare.h"
#include "tests/support/second_loss.h"
#include "tests/support/snapshot_leftovers.h"

namespace weft::test {
namespace {

using namespace live;

// The node index agent `k` says it has in `epoch` ("is node I of N (... epoch E)"); -1: none.
int index_in_epoch(const LiveJob& job, int k, int epoch) {
  static const std::regex re(R"( is node (\d+) of \d+ \(.*, epoch (\d+)\))");
  for (const std::string& l : job.lines_with(k, " is node ")) {
    std::smatch m;
    if (std::regex_search(l, m, re) && std::stoi(m[2]) == epoch) return std::stoi(m[1]);
  }
  return -1;
}

// The agents among `ks` whose snapshot agent holds a replica of node `owner`'s rank (one
// process per node: rank = node) in `epoch`.
std::vector<int> replica_holders(const LiveJob& job, std::initializer_list<int> ks, int owner,
                                 int epoch) {
  const std::string line = "holding replicas of node " + std::to_string(owner) + "'s rank " +
                           std::to_string(owner) + " (epoch " + std::to_string(epoch) + ")";
  std::vector<int> out;
  for (int k : ks)
    if (!job.lines_with(k, line).empty()) out.push_back(k);
  return out;
}

TEST(LiveResizeSpareSnapshots, TheSparesAgentSnapshotsInTheLostPlaceAndASecondLossResumesFromIt) {
  LiveJob job;
  job.dir = agent_test_dir("live_resize_spare_snapshots", "replica");
  job.id = "live-spare-snap-" + std::to_string(::getpid());
  job.nnodes = "2:3";
  job.steps = 300;
  // ZeRO-1 over dp3: each rank holds the only live copy of its third of Adam's moments, so
  // the second loss can only be covered by the lost node's snapshots.
  job.sets = {"parallel.dp=auto", "parallel.zero=1", "snapshot.every=1",
              "snapshot.redundancy=replica"};
  SnapshotLeftovers segments{checkpoint::job_id_for_run(job.id)};
  const fs::path ref = reference_run(job.dir, job.steps, {"parallel.dp=auto"});
  job.start_in_order(3);
  ASSERT_TRUE(job.wait_steps(20)) << job.all_logs();
  const int spare = job.start();
  ASSERT_TRUE(poll_until([&] {
    return !job.lines_with(spare, "waiting for its admission").empty();
  })) << job.all_logs();
  // Node 1 dies whole: its worker and its agent (whose snapshot agent follows its guardian).
  const std::vector<pid_t> lost = children(job.pid(1));
  ASSERT_EQ(lost.size(), 1u) << job.all_logs();
  ::kill(lost[0], SIGKILL);
  ::kill(job.pid(1), SIGKILL);
  EXPECT_EQ(job.wait(1), 128 + SIGKILL);
  ASSERT_TRUE(job.wait_world(3, 1, 2)) << phases_text(job.phases()) << job.all_logs();
  const int at = index_in_epoch(job, spare, 2);
  ASSERT_GE(at, 0) << job.text(spare);
  std::printf("[ says     ] the spare is node %d of epoch 2\n", at);
  const int next = (at + 1) % 3, before = (at + 2) % 3;
  // Its weft run tells its agent the real place: the replica goes to the real successor.
  EXPECT_EQ(job.lines_with(spare, "epoch 2: this node's snapshots are replicated to node " +
                                      std::to_string(next) + " (")
                .size(),
            1u)
      << job.text(spare);
  // Its successor holds the replicas of the spare's rank under the spare's real index, and
  // the spare holds its predecessor's.
  ASSERT_TRUE(poll_until([&] {
    return replica_holders(job, {0, 2}, at, 2).size() == 1 &&
           replica_holders(job, {spare}, before, 2).size() == 1;
  })) << job.all_logs();
  // And none of the node after it: a replica kept under a guessed place would show here.
  EXPECT_TRUE(replica_holders(job, {spare}, next, 2).empty()) << job.all_logs();
  // The second loss: the spare dies whole after a few more steps of epoch 2.
  ASSERT_NO_FATAL_FAILURE(expect_second_loss_resumes(
      job, spare, ref, "in-memory snapshots (2 own, 1 replica)", segments.job));
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);
}

}  // namespace
}  // namespace weft::test
