// `weft run --rdzv-backend etcd`: a node whose agent dies is seen lost through the agents'
// peer connections (comm/elastic/peer_check.h), not by its alive key's lease TTL, which is
// the only path etcd itself offers. Three agents on this machine against one real etcd
// member. No timing thresholds: heartbeat_timeout is a minute, so a job that went by the TTL
// would still end within the test's wait, and the cause each survivor names decides.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "tests/comm/etcd_cluster.h"
#include "tests/support/agent_tests.h"

namespace weft::test {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// The line of `log` where its agent says why the job stopped for `lost` (it closed the job,
// or another survivor did first).
std::string lost_line(const std::string& log, const std::string& lost) {
  const size_t at = log.find("lost node " + lost + " (node rank");
  return at == std::string::npos ? "" : log.substr(at, log.find('\n', at) - at);
}

// Three agents of a fixed --nnodes 3 job (each worker sleeps until killed) with `conf`;
// returns once each worker runs. The Agents destructor reaps them however the test ends.
struct ThreeAgents {
  fs::path d;
  EtcdCluster etcd{1};
  Agents agents{{"WEFT_JOB_TOKEN=etcd-peer-check-test-token"}};
  std::vector<pid_t> p;
  std::vector<fs::path> logs;
  ThreeAgents(const std::string& name, const std::string& conf) {
    d = agent_test_dir("etcd_peer", name);
    // clang-format off
    const std::vector<std::string> args = {
        "run", "--nnodes", "3", "--nproc-per-node", "1", "--rdzv-backend", "etcd",
        "--rdzv-endpoint", etcd.endpoint(0), "--rdzv-id", name, "--rdzv-conf", conf, "--",
        "sh", "-c", "echo worker up; exec sleep 600"};
    // clang-format on
    for (int i = 0; i < 3; ++i) {
      logs.push_back(d / (std::to_string(i) + ".log"));
      p.push_back(agents.start(args, logs.back()));
    }
  }
  bool all_up() {
    for (int i = 0; i < 3; ++i)
      if (!wait_for(logs[size_t(i)], "worker up", p[size_t(i)])) return false;
    return true;
  }
  std::string log(int i) { return slurp(logs[size_t(i)]); }
  // SIGKILLs agent i's workers, then (or instead, with `sig`) sends `sig` to the agent.
  void signal_node(int i, int sig) {
    const std::vector<pid_t> its = child_pids(p[size_t(i)]);
    ::kill(p[size_t(i)], sig);
    if (sig == SIGKILL)
      for (pid_t c : its) ::kill(c, SIGKILL);
  }
};

// heartbeat_timeout 60 s: the peer connection must tell first. Node 2's agent and worker are
// SIGKILLed; both survivors stop the job naming node 2 and the peer connection as the cause.
TEST(EtcdPeerCheck, ASigkilledAgentIsSeenLostThroughItsPeerConnection) {
  SKIP_WITHOUT_ETCD();
  ThreeAgents job("killed", "heartbeat_interval=1,heartbeat_timeout=60");
  ASSERT_TRUE(job.all_up()) << job.log(0) << job.log(1) << job.log(2);
  for (int i = 0; i < 3; ++i)
    EXPECT_NE(job.log(i).find("watches the other nodes through peer connections"),
              std::string::npos)
        << job.log(i);
  const std::string lost = agent_node_id(job.p[2]);
  const auto t0 = Clock::now();
  job.signal_node(2, SIGKILL);
  job.agents.wait(job.p[2]);
  for (int i = 0; i < 2; ++i) {
    const int code = job.agents.wait(job.p[size_t(i)]);
    const std::string log = job.log(i);
    std::printf("[ measured ] SIGKILL -> survivor %d exited after %.3f s\n", i,
                std::chrono::duration<double>(Clock::now() - t0).count());
    EXPECT_EQ(code, 1) << log;
    const std::string line = lost_line(log, lost);
    EXPECT_NE(line, "") << log;
    // Same machine and pid namespace: the pidfd tells the process exited, no grace needed.
    EXPECT_NE(line.find("its agent's process exited"), std::string::npos) << line;
    EXPECT_EQ(line.find("heartbeat expired"), std::string::npos) << line;
  }
  if (!::testing::Test::HasFailure()) fs::remove_all(job.d);  // kept with the logs on a failure
}

// A SIGSTOPped agent keeps its connections open (its kernel still answers): the peer check
// does not drop it, and the survivors stop the job only once its heartbeat expired.
TEST(EtcdPeerCheck, ASigstoppedAgentIsLeftToItsHeartbeatTimeout) {
  SKIP_WITHOUT_ETCD();
  ThreeAgents job("stopped", "heartbeat_interval=0.5,heartbeat_timeout=3");
  ASSERT_TRUE(job.all_up()) << job.log(0) << job.log(1) << job.log(2);
  const std::string lost = agent_node_id(job.p[2]);
  job.signal_node(2, SIGSTOP);
  for (int i = 0; i < 2; ++i) {
    const int code = job.agents.wait(job.p[size_t(i)]);
    const std::string log = job.log(i);
    EXPECT_EQ(code, 1) << log;
    const std::string line = lost_line(log, lost);
    EXPECT_NE(line.find("its heartbeat expired"), std::string::npos) << log;
    EXPECT_EQ(log.find("reports node " + lost + " lost"), std::string::npos) << log;
  }
  job.signal_node(2, SIGKILL);  // the Agents destructor reaps it
  if (!::testing::Test::HasFailure()) fs::remove_all(job.d);
}

}  // namespace
}  // namespace weft::test
