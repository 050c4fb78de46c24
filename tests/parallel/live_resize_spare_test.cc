// A spare under online resize (elastic.on_change: reshard): a node started beyond
// --nnodes' MAX waits as a spare, its worker started at once and parked (it loads, plans and
// faults in its likely place, then waits for its agent); when a member dies whole (its agent
// and its worker, SIGKILL), the survivors admit the spare in the next epoch, which takes the
// lost node's place live: the survivors keep their processes, the parked worker enters as a
// newcomer and receives its state through the router, and the run's losses are one process's
// step for step. A parked worker that dies is replaced, parked; a spare never admitted ends
// with the job. No timing thresholds: the time from the kill to the world of three again is
// printed; every wait is bounded.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "tests/support/live_job.h"
#include "tests/support/metrics_compare.h"

namespace weft::test {
namespace {

using namespace live;

// The spare's parked worker, once its agent's log says it waits for its admission.
std::vector<pid_t> parked_worker(LiveJob& job, int spare) {
  if (!poll_until([&] { return !job.lines_with(spare, "waiting for its admission").empty(); }))
    return {};
  return children(job.pid(spare));
}

// The process is gone (reaped by its agent, or by init once the agent ended).
bool gone(pid_t pid) {
  return poll_until([&] {
    if (::kill(pid, 0) != 0) return true;
    const std::string st = slurp(fs::path("/proc") / std::to_string(pid) / "stat");
    const size_t paren = st.rfind(')');
    return paren != std::string::npos && st.size() > paren + 2 && st[paren + 2] == 'Z';
  });
}

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
  ASSERT_TRUE(poll_until([&] {
    return !job.lines_with(spare, "is registered as a spare of epoch").empty();
  })) << job.all_logs();
  // A spare's agent starts its worker at once, parked: it is the one that trains later.
  const std::vector<pid_t> parked = parked_worker(job, spare);
  ASSERT_EQ(parked.size(), 1u) << job.all_logs();
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
  EXPECT_EQ(children(job.pid(spare)), parked) << job.all_logs();
  EXPECT_TRUE(job.lines_with(spare, "replacement worker").empty()) << job.all_logs();
  job.expect_exits({0, 1, spare});
  EXPECT_TRUE(gone(parked[0]));
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

// A parked worker killed (SIGKILL) is replaced in its slot by its agent, parked in turn (one
// of --max-restarts), and nobody else hears of it: the members' workers keep their processes
// and no epoch forms. At the loss, the replacement is the worker that enters and trains.
TEST(LiveResizeSpare, AParkedWorkerThatDiesIsReplacedAndTheReplacementEnters) {
  LiveJob job;
  job.dir = agent_test_dir("live_resize_spare", "parked_killed");
  job.id = "live-spare-killed-" + std::to_string(::getpid());
  job.nnodes = "2:3";
  job.steps = 240;
  job.sets = {"parallel.dp=auto"};
  const fs::path ref = reference_run(job.dir, job.steps, job.sets);
  job.start_in_order(3);
  ASSERT_TRUE(job.wait_steps(10)) << job.all_logs();
  job.max_restarts = 1;  // the spare's agent only
  const int spare = job.start();
  const std::vector<pid_t> first = parked_worker(job, spare);
  ASSERT_EQ(first.size(), 1u) << job.all_logs();
  std::vector<std::vector<pid_t>> before(3);
  for (int k = 0; k < 3; ++k) before[size_t(k)] = children(job.pid(k));
  ::kill(first[0], SIGKILL);
  ASSERT_TRUE(poll_until([&] {
    return job.lines_with(spare, "waiting for its admission").size() >= 2;
  })) << job.all_logs();
  EXPECT_EQ(job.lines_with(spare, "a spare's parked worker: replaced in its slot").size(), 1u)
      << job.all_logs();
  const std::vector<pid_t> second = children(job.pid(spare));
  ASSERT_EQ(second.size(), 1u) << job.all_logs();
  EXPECT_NE(second[0], first[0]);
  EXPECT_TRUE(gone(first[0]));
  for (int k = 0; k < 3; ++k) EXPECT_EQ(children(job.pid(k)), before[size_t(k)]) << "agent " << k;
  EXPECT_TRUE(job.lines_with(0, "resize: epoch").empty()) << job.all_logs();
  ::kill(before[2][0], SIGKILL);  // node 2 dies whole
  ::kill(job.pid(2), SIGKILL);
  EXPECT_EQ(job.wait(2), 128 + SIGKILL);
  ASSERT_TRUE(job.wait_world(3, 1, 2)) << phases_text(job.phases()) << job.all_logs();
  EXPECT_EQ(children(job.pid(spare)), second) << job.all_logs();
  job.expect_exits({0, 1, spare});
  expect_phases(job.phases(), {3, 3});
  EXPECT_NE(job.only_resize_line().find("epoch 1 -> 2, world 3 -> 3"), std::string::npos);
  expect_same_losses(ref, job.metrics(), size_t(job.steps), false, kRelDp);
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);
}

// A spare that is never admitted: when every member finished, its agent stops its parked
// worker and exits 0, leaving nothing behind (the worker gone, its notice folder removed).
TEST(LiveResizeSpare, ASpareNeverAdmittedStopsItsParkedWorkerAtTheJobsEnd) {
  LiveJob job;
  job.dir = agent_test_dir("live_resize_spare", "never_admitted");
  job.id = "live-spare-never-" + std::to_string(::getpid());
  job.nnodes = "2:3";
  job.steps = 300;
  job.sets = {"parallel.dp=auto"};
  job.start_in_order(3);
  ASSERT_TRUE(job.wait_steps(5)) << job.all_logs();
  const int spare = job.start();
  const std::vector<pid_t> parked = parked_worker(job, spare);
  ASSERT_EQ(parked.size(), 1u) << job.all_logs();
  const std::string folder = [&] {
    const std::string env = slurp(fs::path("/proc") / std::to_string(parked[0]) / "environ");
    const size_t at = env.find("WEFT_EPOCH_FILE=");
    if (at == std::string::npos) return std::string();
    const std::string path = env.substr(at + 16, env.find('\0', at) - at - 16);
    return fs::path(path).parent_path().string();
  }();
  ASSERT_FALSE(folder.empty()) << job.all_logs();
  EXPECT_TRUE(fs::exists(folder));
  job.expect_exits({0, 1, 2, spare});
  const char* ended = "the job ended before this spare was admitted; its parked workers stopped";
  EXPECT_EQ(job.lines_with(spare, ended).size(), 1u) << job.all_logs();
  EXPECT_TRUE(job.lines_with(spare, "weft run: failed").empty()) << job.all_logs();
  EXPECT_TRUE(gone(parked[0]));
  EXPECT_FALSE(fs::exists(folder));
  expect_phases(job.phases(), {3});
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);
}

}  // namespace
}  // namespace weft::test
