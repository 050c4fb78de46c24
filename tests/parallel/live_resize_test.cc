// Online resize with real agents and workers on this machine (one agent per node, nodes on
// loopback): elastic.on_change: reshard. Workers are SIGKILLed and nodes join mid-run; the
// survivors keep their processes (the same PIDs before and after), the router moves the
// live state into the new world's layout, and the run's losses equal one process's step
// for step. No timing thresholds: every wait is bounded by a patience far beyond its need.
// More layouts (tp, pp, ep, ZeRO, a lone survivor, a checkpoint fallback):
// live_resize_layouts_test.cc; the harness: live_job.h.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <optional>
#include <thread>

#include "tests/parallel/live_job.h"

namespace weft::test {
namespace {

using namespace live;  // NOLINT: the harness of this file

// Data parallelism over 2, 3 or 4 ranks regroups the sums of one process's 12 micro-batches.
constexpr double kRelDp = 1e-6;

// dp4 -> dp2 (two workers SIGKILLed; their nodes leave) -> dp3 (a node joins): the survivors
// keep their processes, take the state from each other (every DP replica holds all of it),
// and the run equals one process's.
TEST(LiveResize, Dp4ToDp2ByKillsThenDp3ByAJoinKeepsSurvivorsAndTheNumbers) {
  LiveJob job;
  job.dir = agent_test_dir("live_resize", "dp");
  job.id = "live-dp";
  job.sets = {"parallel.dp=auto"};
  const fs::path ref = reference_run(job.config, job.dir, job.steps, {});
  job.start_in_order(4);
  ASSERT_TRUE(job.wait_steps(20)) << job.all_logs();
  std::vector<std::vector<pid_t>> before(4);
  for (int k = 0; k < 4; ++k) before[size_t(k)] = children(job.pid(k));
  for (int k = 0; k < 4; ++k) ASSERT_EQ(before[size_t(k)].size(), 1u) << "agent " << k;
  for (int k : {2, 3}) ::kill(before[size_t(k)][0], SIGKILL);
  ASSERT_TRUE(job.wait_world(2, 20)) << phases_text(job.phases()) << job.all_logs();
  // The two nodes whose worker died leave the job (no restarts left); the others go on.
  for (int k : {2, 3}) {
    std::optional<int> code = job.wait(k);
    ASSERT_TRUE(code) << job.all_logs();
    EXPECT_EQ(*code, 1) << job.all_logs();
  }
  job.start();  // a fourth node... the job's third after the losses
  ASSERT_TRUE(job.wait_world(3, 10)) << phases_text(job.phases()) << job.all_logs();
  // The survivors' workers are the same processes as before both changes.
  for (int k : {0, 1}) EXPECT_EQ(children(job.pid(k)), before[size_t(k)]) << "agent " << k;
  for (int k : {0, 1, 4}) {
    std::optional<int> code = job.wait(k);
    ASSERT_TRUE(code) << job.all_logs();
    EXPECT_EQ(*code, 0) << job.all_logs();
  }
  const auto p = job.phases();
  ASSERT_EQ(p.size(), 3u) << phases_text(p);
  EXPECT_EQ(p[0].first, WorldEpoch(4, 1)) << phases_text(p);
  EXPECT_EQ(p[1].first.first, 2) << phases_text(p);
  EXPECT_EQ(p[2].first.first, 3) << phases_text(p);
  expect_losses_by_step(ref, job.metrics(), size_t(job.steps), kRelDp, 2);
  const std::string lead = slurp(job.logs[0]);
  EXPECT_NE(lead.find("world 4 -> 2"), std::string::npos) << lead;
  EXPECT_NE(lead.find("state from 2 holders through the router"), std::string::npos) << lead;
  EXPECT_NE(lead.find("world 2 -> 3"), std::string::npos) << lead;
  fs::remove_all(job.dir);
}

// A second loss while the survivors form the next world: of three one-worker nodes, node 1's
// worker is frozen (SIGSTOP) and node 2's killed, so epoch 2 = {0, 1} forms and node 0's
// worker waits in its bootstrap for a rank that never comes; then node 1's worker is killed
// and its node leaves (epoch 3 = {0}). The survivor must give up the stale epoch at once
// and go on alone in epoch 3 (with the state it held), then take a newcomer.
TEST(LiveResize, ASecondLossWhileTheNextWorldFormsMovesOnToTheNewerEpoch) {
  LiveJob job;
  job.dir = agent_test_dir("live_resize", "stale");
  job.id = "live-stale";
  job.nnodes = "1:3";
  job.sets = {"parallel.dp=auto"};
  const fs::path ref = reference_run(job.config, job.dir, job.steps, {});
  job.start_in_order(3);
  ASSERT_TRUE(job.wait_steps(20)) << job.all_logs();
  std::vector<std::vector<pid_t>> before(3);
  for (int k = 0; k < 3; ++k) before[size_t(k)] = children(job.pid(k));
  for (int k = 0; k < 3; ++k) ASSERT_EQ(before[size_t(k)].size(), 1u) << "agent " << k;
  ::kill(before[1][0], SIGSTOP);
  ::kill(before[2][0], SIGKILL);
  ASSERT_TRUE(poll_until([&] {
    return slurp(job.logs[0]).find("membership changed: epoch 1 -> 2") != std::string::npos;
  })) << job.all_logs();
  std::this_thread::sleep_for(
      std::chrono::milliseconds(300));  // node 0 waits in epoch 2's bootstrap
  const auto t_second = Clock::now();
  ::kill(before[1][0], SIGKILL);
  ASSERT_TRUE(job.wait_world(1, 20)) << phases_text(job.phases()) << job.all_logs();
  const double moved_s = seconds_since(t_second);
  for (int k : {1, 2}) {
    std::optional<int> code = job.wait(k);
    ASSERT_TRUE(code) << job.all_logs();
    EXPECT_EQ(*code, 1) << job.all_logs();
  }
  job.start();
  ASSERT_TRUE(job.wait_world(2, 10)) << phases_text(job.phases()) << job.all_logs();
  EXPECT_EQ(children(job.pid(0)), before[0]) << job.all_logs();
  for (int k : {0, 3}) {
    std::optional<int> code = job.wait(k);
    ASSERT_TRUE(code) << job.all_logs();
    EXPECT_EQ(*code, 0) << job.all_logs();
  }
  const auto p = job.phases();
  expect_phases(p, {3, 1, 2});
  if (p.size() == 3) {
    EXPECT_EQ(p[1].first, WorldEpoch(1, 3)) << phases_text(p);
  }
  expect_losses_by_step(ref, job.metrics(), size_t(job.steps), kRelDp, 2);
  const std::vector<std::string> r = job.lines_with(0, "resize: ");
  for (const std::string& l : r) std::printf("%s\n", l.c_str());
  ASSERT_EQ(r.size(), 2u) << job.all_logs();
  EXPECT_NE(r[0].find("epoch 1 -> 3, world 3 -> 1"), std::string::npos) << r[0];
  EXPECT_NE(r[0].find("state from 1 holder through the router"), std::string::npos) << r[0];
  EXPECT_NE(r[1].find("world 1 -> 2"), std::string::npos) << r[1];
  std::printf("[ timing ] second loss -> 20 steps at world 1: %.1f s\n", moved_s);
  fs::remove_all(job.dir);
}

}  // namespace
}  // namespace weft::test
