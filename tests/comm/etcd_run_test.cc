// `weft run --rdzv-backend etcd`: the membership lives in a real etcd cluster (three members
// on loopback), so the job survives the loss of an etcd member and of the node that serves
// the workers' store, which the built-in store (hosted by one agent) cannot.
// No timing thresholds: every wait is bounded by the test's ctest timeout.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/comm/etcd_cluster.h"
#include "tests/support/metrics_compare.h"
#include "tests/support/agent_tests.h"
#include "tests/support/run_weft.h"

namespace weft::test {
namespace {

namespace fs = std::filesystem;
const std::string kConfig = std::string(WEFT_SOURCE_DIR) + "/configs/gpt-layout.yaml";

fs::path temp_dir(const std::string& name) { return agent_test_dir("etcd_run", name); }

// The agents of one test, with the job token.
struct EtcdAgents : Agents {
  EtcdAgents() : Agents({"WEFT_JOB_TOKEN=etcd-run-test-token"}) {}
};

std::vector<std::string> train(const fs::path& d, int steps, const std::vector<std::string>& extra) {
  std::vector<std::string> c = {"weft", "train", "--config", kConfig,
                                "--set", "train.steps=" + std::to_string(steps),
                                "--set", "train.warmup_steps=1",
                                "--set", "train.log_every=1",
                                "--set", "train.global_batch=12",
                                "--set", "train.micro_batch=2",
                                "--set", "train.out_dir=" + (d / "out").string()};
  c.insert(c.end(), extra.begin(), extra.end());
  return c;
}

std::vector<std::string> agent(const EtcdCluster& etcd, const std::string& nnodes,
                               const std::string& id, const std::vector<std::string>& command,
                               const std::vector<std::string>& extra = {}) {
  std::string endpoints;
  for (const std::string& e : etcd.endpoints()) endpoints += (endpoints.empty() ? "" : ",") + e;
  std::vector<std::string> a = {"run", "--nnodes", nnodes, "--nproc-per-node", "1",
                                "--rdzv-backend", "etcd", "--rdzv-endpoint", endpoints,
                                "--rdzv-id", id, "--rdzv-conf",
                                "heartbeat_interval=0.5,heartbeat_timeout=3,last_call_timeout=0.5"};
  a.insert(a.end(), extra.begin(), extra.end());
  a.push_back("--");
  a.insert(a.end(), command.begin(), command.end());
  return a;
}

// The single-process run every layout must equal.
void reference(const fs::path& d, int steps) {
  std::string cmd = std::string(WEFT_BINARY);
  for (const std::string& a : train(d / "one", steps, {})) cmd += a == "weft" ? "" : " " + a;
  CommandResult one = run_command(cmd);
  ASSERT_EQ(one.code, 0) << one.out;
}

// Two nodes train while the etcd member that answers them (the raft leader) is SIGKILLed:
// the agents' store fails over to the other two members, heartbeats go on, nobody is
// declared lost, and the losses equal one process's.
TEST(EtcdRun, TrainingGoesOnWhenAnEtcdMemberDies) {
  SKIP_WITHOUT_ETCD();
  fs::path d = temp_dir("member");
  const int steps = 300;
  reference(d, steps);
  EtcdCluster etcd(3);
  EtcdAgents agents;
  const auto cmd = train(d, steps, {"--set", "parallel.dp=2"});
  pid_t a = agents.start(agent(etcd, "2", "member", cmd), d / "a.log");
  pid_t b = agents.start(agent(etcd, "2", "member", cmd), d / "b.log");
  ASSERT_TRUE(wait_until([&] { return (slurp(d / "a.log") + slurp(d / "b.log")).find("step    30/") != std::string::npos; }, a))
      << slurp(d / "a.log");
  const int leader = etcd.leader();
  ASSERT_GE(leader, 0);
  etcd.kill(leader);
  int ca = agents.wait(a), cb = agents.wait(b);
  std::string logs = slurp(d / "a.log") + "\n---\n" + slurp(d / "b.log");
  ASSERT_EQ(ca, 0) << logs;
  ASSERT_EQ(cb, 0) << logs;
  EXPECT_EQ(logs.find("membership changed"), std::string::npos) << logs;  // nobody was lost
  expect_same_losses(d / "one" / "out" / "metrics.jsonl", d / "out" / "metrics.jsonl", steps);
  fs::remove_all(d);
}

// Node 0 serves the workers' store; it dies (agent SIGKILLed, its workers with it). The two
// survivors (a strict majority of three, --nnodes 2:3) re-form, the new node 0 serves a new
// workers' store, they resume from the checkpoint and finish with the single process's
// losses. (With the built-in store the job would stop: the store lived in that agent.)
TEST(EtcdRun, LosingTheNodeThatServesTheWorkersStoreIsARestart) {
  SKIP_WITHOUT_ETCD();
  fs::path d = temp_dir("node0");
  const int steps = 300;
  reference(d, steps);
  EtcdCluster etcd(1);
  EtcdAgents agents;
  const auto cmd = train(d, steps,
                         {"--set", "checkpoint.dir=" + (d / "ckpt").string(), "--set",
                          "checkpoint.every=10", "--set", "checkpoint.async=false", "--set",
                          "elastic.on_change=restart"});
  const std::vector<std::string> elastic = {"--max-restarts", "2"};
  std::vector<pid_t> pids;
  for (int i = 0; i < 3; ++i)
    pids.push_back(agents.start(agent(etcd, "2:3", "node0", cmd, elastic),
                                d / (std::to_string(i) + ".log")));
  ASSERT_TRUE(wait_until([&] { return fs::exists(d / "ckpt" / "step-00000050"); }, pids[0]))
      << slurp(d / "0.log");
  int node0 = -1;
  for (int i = 0; i < 3; ++i)
    if (slurp(d / (std::to_string(i) + ".log")).find("is node 0 of 3") != std::string::npos) node0 = i;
  ASSERT_GE(node0, 0);
  ::kill(pids[size_t(node0)], SIGKILL);
  agents.wait(pids[size_t(node0)]);
  std::string logs;
  for (int i = 0; i < 3; ++i) {
    if (i == node0) continue;
    const int code = agents.wait(pids[size_t(i)]);
    const std::string log = slurp(d / (std::to_string(i) + ".log"));
    logs += log + "\n---\n";
    EXPECT_EQ(code, 0) << log;
    EXPECT_NE(log.find("membership changed: epoch 1 -> 2, 3 -> 2 nodes (lost "), std::string::npos)
        << log;
  }
  EXPECT_NE(logs.find("is node 0 of 2 (epoch 2)"), std::string::npos) << logs;
  EXPECT_NE(logs.find("checkpoint: resumed from"), std::string::npos) << logs;
  expect_same_losses(d / "one" / "out" / "metrics.jsonl", d / "out" / "metrics.jsonl", steps);
  auto rows = core::io::read_metrics((d / "out" / "metrics.jsonl").string());
  EXPECT_EQ(rows.front().at("world"), 3);
  EXPECT_EQ(rows.front().at("epoch"), 1);
  EXPECT_EQ(rows.back().at("world"), 2);
  EXPECT_EQ(rows.back().at("epoch"), 2);
  fs::remove_all(d);
}

}  // namespace
}  // namespace weft::test
