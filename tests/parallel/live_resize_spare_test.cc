// A spare under online resize (elastic.on_change: reshard): a node started beyond
// --nnodes' MAX waits as a spare; when a member dies whole (its agent and its worker,
// SIGKILL), the survivors admit the spare in the next epoch, which takes the lost node's place
// live: the survivors keep their processes, the spare's worker receives its state through the
// router, and the run's losses are one process's step for step. No timing thresholds: the
// time from the kill to the world of three again is printed; every wait is bounded.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <optional>

#include "tests/support/live_job.h"
#include "tests/support/metrics_compare.h"

namespace weft::test {
namespace {

using namespace live;

TEST(LiveResizeSpare, ASpareTakesTheLostNodesPlaceAndTheSurvivorsKeepTheirProcesses) {
  LiveJob job;
  job.dir = agent_test_dir("live_resize_spare", "spare");
  job.id = "live-spare-" + std::to_string(::getpid());
  job.nnodes = "2:3";
  // The loss comes at step 20 or later and the spare trains within a few dozen steps; the
  // rest of the run and its reference are only time.
  job.steps = 240;
  job.sets = {"parallel.dp=auto"};  // every DP replica holds all of the state
  const fs::path ref = reference_run(job.dir, job.steps, job.sets);
  job.start_in_order(3);
  ASSERT_TRUE(job.wait_steps(20)) << job.all_logs();
  const int spare = job.start();
  ASSERT_TRUE(poll_until([&] { return !job.lines_with(spare, "waits as a spare").empty(); }))
      << job.all_logs();
  // A spare's agent starts no worker before it is admitted.
  EXPECT_TRUE(children(job.pid(spare)).empty()) << job.all_logs();
  std::vector<std::vector<pid_t>> before(3);
  for (int k = 0; k < 3; ++k) {
    before[size_t(k)] = children(job.pid(k));
    ASSERT_EQ(before[size_t(k)].size(), 1u) << "agent " << k << "\n" << job.all_logs();
  }
  // Node ids are "<hostname>-<agent pid>"; a waited-for agent's pid() is -1.
  const std::string lost = "-" + std::to_string(job.pid(2)) + ")";
  const std::string joined = "-" + std::to_string(job.pid(spare)) + ")";
  const auto t0 = Clock::now();
  ::kill(before[2][0], SIGKILL);  // node 2 dies whole: its worker and its agent
  ::kill(job.pid(2), SIGKILL);
  EXPECT_EQ(job.wait(2), 128 + SIGKILL);
  ASSERT_TRUE(job.wait_world(3, 1, 2)) << phases_text(job.phases()) << job.all_logs();
  std::printf("[ measured ] the world of three trained again (epoch 2, the spare in) %.2f s "
              "after the kill\n",
              seconds_since(t0));
  for (int k : {0, 1}) EXPECT_EQ(children(job.pid(k)), before[size_t(k)]) << "agent " << k;
  job.expect_exits({0, 1, spare});
  expect_phases(job.phases(), {3, 3});
  const std::string resize = job.only_resize_line();
  EXPECT_NE(resize.find("epoch 1 -> 2, world 3 -> 3"), std::string::npos) << resize;
  const size_t l = resize.find("(lost "), j = resize.find(") (joined ");
  ASSERT_NE(l, std::string::npos) << resize;
  ASSERT_NE(j, std::string::npos) << resize;
  EXPECT_EQ(resize.substr(l, j + 1 - l).find(lost), resize.substr(l, j + 1 - l).size() - lost.size())
      << resize;
  EXPECT_NE(resize.find(joined, j), std::string::npos) << resize;
  // The spare's worker holds nothing: it gets a whole replica from the survivors.
  EXPECT_NE(resize.find("through the router"), std::string::npos) << resize;
  EXPECT_EQ(resize.find("steps back"), std::string::npos) << resize;
  expect_same_losses(ref, job.metrics(), size_t(job.steps), false, kRelDp);
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);
}

}  // namespace
}  // namespace weft::test
