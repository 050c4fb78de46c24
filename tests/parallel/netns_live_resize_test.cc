// Online resize (elastic.on_change: reshard) across hosts that are network namespaces
// (tests/support/netns.h): one agent per host, the store in host 0's agent. Host 2's agent is
// SIGKILLed (its worker dies with it), later a fresh agent on host 2 joins: the survivors keep
// their processes, the router moves the state between hosts over the communicator (never
// shared memory: the ranks' host keys differ), and the losses are one process's step for step.
// No timing thresholds: times are printed; every wait is bounded.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <sstream>

#include "tests/support/live_job.h"
#include "tests/support/metrics_compare.h"

namespace weft::test {
namespace {

using namespace live;

// Whether `pid` is gone (or a zombie nobody reaped yet).
bool gone(pid_t pid) {
  std::istringstream in(slurp("/proc/" + std::to_string(pid) + "/stat"));
  std::string pidtext, comm, state;
  in >> pidtext >> comm >> state;
  return state.empty() || state == "Z";
}

// One rank's router line (WEFT_LOG_SUBSYS=router at debug level, parallel/router_exec.cc).
struct RouterLine {
  long long rank = -1, comm_out = 0, comm_in = 0, shm_out = 0, shm_in = 0;
  long long striped_out = 0, striped_in = 0, connections = 0;
};
std::vector<RouterLine> router_lines(const std::string& log) {
  std::vector<RouterLine> out;
  for (const std::string& line : lines_with(log, "router transition (rank ")) {
    RouterLine r;
    if (std::sscanf(line.c_str() + line.find("router transition (rank "),
                    "router transition (rank %lld): %lld B out, %lld B in through the "
                    "communicator; %lld B out, %lld B in through shared memory; %lld B out, "
                    "%lld B in striped over %lld connections",
                    &r.rank, &r.comm_out, &r.comm_in, &r.shm_out, &r.shm_in, &r.striped_out,
                    &r.striped_in, &r.connections) == 8)
      out.push_back(r);
  }
  return out;
}

// (3, epoch 1) -> host 2's agent SIGKILLed -> (2, epoch 2) -> a fresh agent on host 2 joins
// -> (3, epoch 3). With elastic.transfer_connections 1 and 4 (the default): the state
// crosses hosts over one connection per pair or striped over four, and the numbers are the
// same either way (those of one process).
class NetnsLiveResize : public ::testing::TestWithParam<int> {};

TEST_P(NetnsLiveResize, HostLostThenAFreshAgentJoinsKeepsSurvivorsAndTheNumbers) {
  const int connections = GetParam();
  std::string why;
  if (!VirtualHosts::available(&why)) GTEST_SKIP() << why;
  ASSERT_EQ(::access(WEFT_BINARY, X_OK), 0) << WEFT_BINARY << " is built with the tests";
  const auto t_test = Clock::now();
  VirtualHosts hosts(3);
  LiveJob job;
  job.dir = agent_test_dir("netns_live_resize", "323-k" + std::to_string(connections));
  job.id = "netns-live";
  job.hosts = &hosts;
  job.nnodes = "2:3";
  // The join comes near step 50 (three ranks make 60 to 100 steps/s) and is over by about
  // step 70; the rest of the run and its reference are only time.
  job.steps = 180;
  job.token = "netns-live-resize-test-token";
  job.sets = {"parallel.dp=auto", "elastic.transfer_connections=" + std::to_string(connections)};
  job.env = {"WEFT_LOG_LEVEL=debug", "WEFT_LOG_SUBSYS=router"};  // the router's byte counts
  const fs::path ref = reference_run(job.dir, job.steps, {"parallel.dp=auto"});
  ASSERT_NO_FATAL_FAILURE(job.start_in_order(3));
  ASSERT_TRUE(job.wait_steps(20)) << job.all_logs();
  std::vector<std::vector<pid_t>> before(3);
  for (int k = 0; k < 3; ++k) {
    before[size_t(k)] = children(job.pid(k));
    ASSERT_EQ(before[size_t(k)].size(), 1u) << "agent " << k << "\n" << job.all_logs();
  }
  const auto t0 = Clock::now();
  ASSERT_EQ(::kill(job.pid(2), SIGKILL), 0);
  EXPECT_TRUE(poll_until([&] { return gone(before[2][0]); }, 30))
      << "host 2's worker outlived its agent";
  EXPECT_EQ(job.wait(2), 128 + SIGKILL);
  ASSERT_TRUE(job.wait_world(2, 20)) << phases_text(job.phases()) << job.all_logs();
  std::printf("[ measured ] world of 2 trained 20 steps %.2f s after the agent's kill\n",
              seconds_since(t0));
  const auto t1 = Clock::now();
  const int k3 = job.start(2);
  ASSERT_TRUE(job.wait_world(3, 10, 3)) << phases_text(job.phases()) << job.all_logs();
  std::printf(
      "[ measured ] world of 3 trained 10 steps %.2f s after the fresh agent started, "
      "%zu of %d steps logged\n",
      seconds_since(t1), job.rows().size(), job.steps);
  for (int k : {0, 1}) EXPECT_EQ(children(job.pid(k)), before[size_t(k)]) << "agent " << k;
  for (int k : {0, 1, k3}) {
    std::optional<int> code = job.wait(k);
    ASSERT_TRUE(code) << job.all_logs();
    EXPECT_EQ(*code, 0) << job.all_logs();
  }
  std::printf("[ measured ] test took %.1f s\n", seconds_since(t_test));
  const auto p = job.phases();
  ASSERT_EQ(p.size(), 3u) << phases_text(p);
  EXPECT_EQ(p[0].first, WorldEpoch(3, 1)) << phases_text(p);
  EXPECT_EQ(p[1].first, WorldEpoch(2, 2)) << phases_text(p);
  EXPECT_EQ(p[2].first, WorldEpoch(3, 3)) << phases_text(p);
  const std::vector<std::string> resizes = lines_with(job.text(0), "resize: epoch");
  expect_losses_by_step(ref, job.metrics(), kRelDp);
  ASSERT_EQ(resizes.size(), 2u) << job.all_logs();
  EXPECT_NE(resizes[0].find("epoch 1 -> 2, world 3 -> 2"), std::string::npos) << resizes[0];
  EXPECT_NE(resizes[1].find("epoch 2 -> 3, world 2 -> 3"), std::string::npos) << resizes[1];
  for (const std::string& l : resizes) std::printf("[ says     ] %s\n", l.c_str());
  // The kill may leave a survivor one step behind; the join finds both at a step boundary.
  expect_state_from_survivors(resizes[0], 2);
  EXPECT_NE(resizes[1].find("state from 2 holders through the router"), std::string::npos)
      << resizes[1];
  // Nothing crossed shared memory (each rank is a host of its own); the newcomer received
  // its whole state through the communicator.
  size_t lines = 0;
  for (int k : {0, 1, k3})
    for (const RouterLine& r : router_lines(job.text(k))) {
      ++lines;
      EXPECT_EQ(r.shm_out + r.shm_in, 0) << "rank " << r.rank << " of agent " << k;
    }
  EXPECT_EQ(lines, 2u + 3u) << "one router line per rank per resize\n" << job.all_logs();
  const std::vector<RouterLine> joined = router_lines(job.text(k3));
  ASSERT_EQ(joined.size(), 1u) << job.text(k3);
  EXPECT_GT(joined[0].comm_in, 0) << job.text(k3);
  // Striped over every connection, or over one (then nothing counts as striped).
  EXPECT_EQ(joined[0].connections, connections) << job.text(k3);
  if (connections > 1) {
    EXPECT_GT(joined[0].striped_in, 0) << job.text(k3);
  } else {
    EXPECT_EQ(joined[0].striped_in, 0) << job.text(k3);
  }
  std::printf(
      "[ measured ] the newcomer received %lld B through the communicator (%lld B of it "
      "striped over %lld connections), 0 B through shared memory\n",
      joined[0].comm_in, joined[0].striped_in, joined[0].connections);
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);  // kept for a look otherwise
}

INSTANTIATE_TEST_SUITE_P(Connections, NetnsLiveResize, ::testing::Values(1, 4),
                         [](const auto& info) { return "K" + std::to_string(info.param); });

}  // namespace
}  // namespace weft::test
