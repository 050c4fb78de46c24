// A node lost with its processes (agent and workers SIGKILLed; the kernel closes their
// sockets): the survivors learn it from the store dropping the node's connection-bound alive
// key, not from its heartbeat expiring, and go on in a new epoch. Three `weft run` agents on
// this machine; the first hosts the store. No timing thresholds: the cause is asserted (the
// agents log which of the two paths told them), the time is printed.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/agent_tests.h"

namespace weft::test {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// wait_for(), bounded: a hang guard (the test fails instead of waiting for its ctest timeout,
// and the Agents destructor reaps everything), never a timing expectation.
bool wait_for_log(const fs::path& log, const std::string& text, pid_t pid) {
  const auto until = Clock::now() + std::chrono::seconds(120);
  return wait_until(
             [&] { return slurp(log).find(text) != std::string::npos || Clock::now() > until; },
             pid) &&
         slurp(log).find(text) != std::string::npos;
}

// Three agents (the first hosts the store, with `conf` as --rdzv-conf); node 2's agent and
// workers are SIGKILLed at once; the survivors go on in epoch 2. Returns each survivor's
// complete log, after checking that it exited 0 naming the lost node; `lost` gets its id.
std::vector<std::string> lose_node_two(const std::string& name, const std::string& conf,
                                       std::string& lost) {
  const fs::path d = agent_test_dir("loss", name);
  Agents agents({"WEFT_JOB_TOKEN=node-loss-test-token"});
  const int port = free_port();
  // A worker ends once `done` exists and its node is in epoch 2.
  const std::string worker = "echo world $GROUP_WORLD_SIZE epoch $WEFT_RDZV_EPOCH; while [ ! -f " +
                             (d / "done").string() +
                             " ] || [ $WEFT_RDZV_EPOCH != 2 ]; do sleep 0.05; done";
  const std::string endpoint = "127.0.0.1:" + std::to_string(port);
  // clang-format off
  const std::vector<std::string> args = {
      "run", "--nnodes", "2:3", "--nproc-per-node", "1", "--max-restarts", "1",
      "--rdzv-backend", "c10d", "--rdzv-id", "loss", "--rdzv-endpoint", endpoint,
      "--rdzv-conf", conf, "--", "sh", "-c", worker};
  // clang-format on
  std::vector<pid_t> p;
  std::vector<fs::path> logs;
  for (int i = 0; i < 3; ++i) {
    logs.push_back(d / (std::to_string(i) + ".log"));
    p.push_back(agents.start(args, logs.back()));
    if (i == 0) {
      EXPECT_TRUE(wait_for_log(logs[0], "serves the rendezvous store", p[0])) << slurp(logs[0]);
      if (::testing::Test::HasFailure()) return {};
    }
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(wait_for_log(logs[size_t(i)], "world 3 epoch 1", p[size_t(i)]))
        << slurp(logs[size_t(i)]);
    if (::testing::Test::HasFailure()) return {};
  }
  for (int i = 0; i < 3; ++i)
    EXPECT_NE(slurp(logs[size_t(i)]).find("is bound to its store connection"), std::string::npos)
        << slurp(logs[size_t(i)]);

  // Node 2 (not the store's host) loses its agent and its workers at once.
  const pid_t victim = p[2];
  const std::vector<pid_t> its = child_pids(victim);
  EXPECT_FALSE(its.empty()) << "the agent's worker was not found";
  const auto t0 = Clock::now();
  ::kill(victim, SIGKILL);
  for (pid_t c : its) ::kill(c, SIGKILL);
  agents.wait(victim);
  // Printed, never asserted: SIGKILL -> each survivor's log saying it is in epoch 2.
  double seen[2] = {-1, -1};
  while ((seen[0] < 0 || seen[1] < 0) &&
         std::chrono::duration<double>(Clock::now() - t0).count() < 60) {
    for (int i = 0; i < 2; ++i)
      if (seen[i] < 0 && slurp(logs[size_t(i)]).find("of epoch 2 (") != std::string::npos)
        seen[i] = std::chrono::duration<double>(Clock::now() - t0).count();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::printf(
      "[ measured ] SIGKILL of node 2's agent and workers -> survivors in epoch 2 after "
      "%.3f s and %.3f s (--rdzv-conf %s)\n",
      seen[0], seen[1], conf.c_str());
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(wait_for_log(logs[size_t(i)], "world 2 epoch 2", p[size_t(i)]))
        << slurp(logs[size_t(i)]);
    if (::testing::Test::HasFailure()) return {};
  }
  std::ofstream(d / "done") << "1";
  lost = agent_node_id(victim);
  std::vector<std::string> out;
  for (int i = 0; i < 2; ++i) {
    const int code = agents.wait(p[size_t(i)]);  // then its log is complete
    out.push_back(slurp(logs[size_t(i)]));
    EXPECT_EQ(code, 0) << out.back();
    EXPECT_NE(out.back().find("membership changed: epoch 1 -> 2, 3 -> 2 nodes (lost " + lost + ")"),
              std::string::npos)
        << out.back();
  }
  if (!::testing::Test::HasFailure()) fs::remove_all(d);
  return out;
}

// The line in `log` where its agent says why it takes `lost` for lost.
std::string lost_line(const std::string& log, const std::string& lost) {
  const size_t at = log.find("sees node " + lost + " (node rank ");
  return at == std::string::npos ? "" : log.substr(at, log.find('\n', at) - at);
}

TEST(NodeLoss, SurvivorsLearnOfAKilledNodeFromItsClosedStoreConnection) {
  // heartbeat_timeout 10 s: were the connection path broken, the TTL would still form epoch
  // 2 (in bounded time), and the cause below would fail the test. last_call_timeout 30 s:
  // epoch 1 waits for all three (it forms as soon as they are there, at max), so that a slow
  // start cannot make it a 2-node epoch that the third joins later.
  std::string lost;
  const std::vector<std::string> logs = lose_node_two(
      "closed", "heartbeat_interval=0.5,heartbeat_timeout=10,last_call_timeout=30,join_timeout=60",
      lost);
  ASSERT_EQ(logs.size(), 2u);
  EXPECT_NE(logs[0].find("serves the rendezvous store on 127.0.0.1:"), std::string::npos);
  EXPECT_NE(logs[0].find(" (bound_key_grace 0.25 s)\n"), std::string::npos) << logs[0];
  // Each survivor names the cause: the store dropped the node's bound key when its
  // connection closed. Never the heartbeat expiry, which is the fallback.
  for (const std::string& log : logs) {
    EXPECT_NE(lost_line(log, lost).find("lost in epoch 1: its store connection closed"),
              std::string::npos)
        << log;
    EXPECT_EQ(log.find("heartbeat expired"), std::string::npos) << log;
  }
}

// --rdzv-conf bound_key_grace sets the hosted store's grace, which keeps a closed
// connection's keys for a client that reconnects. A client on the store's machine tells the
// store which process it is, and a process that has exited never reconnects: a killed agent's
// key goes at its exit even under a grace longer than heartbeat_timeout (its alive key's own
// TTL then ends before the grace), so the survivors still learn of the loss from the closed
// connection, never from the TTL (before the store watched processes, this grace left the
// loss to the TTL). A live client keeps its keys for the grace
// (StoreBound.ClosedConnectionOfALiveProcessKeepsItsKeysForTheGrace).
TEST(NodeLoss, AKilledAgentOnTheStoresMachineIsKnownAtItsExitWhateverTheBoundKeyGrace) {
  std::string lost;
  const std::vector<std::string> logs = lose_node_two(
      "grace",
      "heartbeat_interval=0.5,heartbeat_timeout=2,last_call_timeout=30,join_timeout=60,"
      "bound_key_grace=30",
      lost);
  ASSERT_EQ(logs.size(), 2u);
  EXPECT_NE(logs[0].find(" (bound_key_grace 30 s)\n"), std::string::npos) << logs[0];
  for (const std::string& log : logs) {
    EXPECT_NE(lost_line(log, lost).find("lost in epoch 1: its store connection closed"),
              std::string::npos)
        << log;
    EXPECT_EQ(log.find("heartbeat expired"), std::string::npos) << log;
  }
}

}  // namespace
}  // namespace weft::test
