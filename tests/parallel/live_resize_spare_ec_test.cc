// A spare of a job whose in-memory snapshots are erasure-coded (snapshot.every: 1, redundancy
// ec, k=2 m=1: three nodes, one stripe group). Its snapshot agent starts beside its parked
// worker at a guessed place. Node 1 of three dies whole: its shard is rebuilt from parity and,
// once the spare is admitted, epoch 2 has three nodes again and its snapshots must be
// erasure-coded over them: every agent of epoch 2 says so under a distinct place, and parity
// of epoch 2 is held. Then the spare dies whole in turn: the survivors rebuild its shard from
// epoch 2's parity and resume with one process's numbers. Real processes, real signals; every
// process and segment is reaped however the test ends. No timing thresholds.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <regex>
#include <set>
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

// The place agent `k`'s snapshot agent says it has in the erasure-coded `epoch`; -1: none.
int coded_place(const LiveJob& job, int k, int epoch) {
  static const std::regex re(
      R"(\[snapshot-agent\] epoch (\d+): this node is node (\d+) of 3; its snapshots are erasure-coded)");
  for (const std::string& l : job.lines_with(k, "its snapshots are erasure-coded")) {
    std::smatch m;
    if (std::regex_search(l, m, re) && std::stoi(m[1]) == epoch) return std::stoi(m[2]);
  }
  return -1;
}

TEST(LiveResizeSpareEc, TheAdmittedSparesSnapshotsAreErasureCodedAndASecondLossRebuildsThem) {
  LiveJob job;
  job.dir = agent_test_dir("live_resize_spare_ec", "ec");
  job.id = "live-spare-ec-" + std::to_string(::getpid());
  job.nnodes = "2:3";
  job.steps = 300;
  job.sets = {"parallel.dp=auto",       "parallel.zero=1", "snapshot.every=1",
              "snapshot.redundancy=ec", "snapshot.ec.k=2", "snapshot.ec.m=1"};
  SnapshotLeftovers segments{checkpoint::job_id_for_run(job.id)};
  const fs::path ref = reference_run(job.dir, job.steps, {"parallel.dp=auto"});
  job.start_in_order(3);
  ASSERT_TRUE(job.wait_steps(20)) << job.all_logs();
  ASSERT_TRUE(poll_until([&] {
    return job.holds_parity_of(0, 1) || job.holds_parity_of(1, 1) || job.holds_parity_of(2, 1);
  })) << job.all_logs();
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
  // Epoch 2 is coded over its three nodes: each agent says so, each under its own place.
  std::set<int> places;
  ASSERT_TRUE(poll_until([&] {
    places.clear();
    for (int k : {0, 2, spare}) places.insert(coded_place(job, k, 2));
    return places == std::set<int>{0, 1, 2};
  })) << job.all_logs();
  const int at = coded_place(job, spare, 2);
  std::printf("[ says     ] the spare is node %d of epoch 2\n", at);
  // The lost node's shard (the spare has none of it) was rebuilt from epoch 1's parity.
  std::string first;
  for (const std::string& l : job.lines_with(0, "resize: epoch"))
    if (l.find("epoch 1 -> 2") != std::string::npos) first = l;
  const size_t from = first.find("resumed at");
  std::printf("[ says     ] %s\n",
              first.substr(from == std::string::npos ? 0 : from).substr(0, 300).c_str());
  EXPECT_NE(first.find("in-memory snapshots (2 own, 1 rebuilt from parity)"), std::string::npos)
      << job.all_logs();
  // Parity of epoch 2 is held: each node of a group of k + m = 3 holds a parity fragment of
  // the stripes (the parity's place rotates over the group).
  ASSERT_TRUE(poll_until([&] {
    return job.holds_parity_of(0, 2) && job.holds_parity_of(2, 2) && job.holds_parity_of(spare, 2);
  })) << job.all_logs();
  // The second loss: the spare dies whole after a few more steps of epoch 2.
  ASSERT_NO_FATAL_FAILURE(expect_second_loss_resumes(
      job, spare, ref, "in-memory snapshots (2 own, 1 rebuilt from parity)", segments.job));
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);
}

}  // namespace
}  // namespace weft::test
