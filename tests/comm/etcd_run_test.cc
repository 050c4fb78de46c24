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
#include "tests/support/live_job.h"
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

// The default, elastic.on_change: reshard, with the membership in etcd: a node that is not
// node 0 is lost (its agent SIGKILLed, its worker with it); the survivors keep their
// processes and reshard live through the router (every DP replica holds the whole state),
// and the run equals one process's.
TEST(EtcdRun, LiveReshardKeepsTheSurvivorsWhenANodeIsLost) {
  SKIP_WITHOUT_ETCD();
  fs::path d = temp_dir("live");
  const int steps = 300;
  reference(d, steps);
  EtcdCluster etcd(1);
  EtcdAgents agents;
  const auto cmd = train(d, steps, {});
  std::vector<pid_t> pids;
  for (int i = 0; i < 3; ++i)
    pids.push_back(agents.start(agent(etcd, "2:3", "live", cmd), d / (std::to_string(i) + ".log")));
  auto log_of = [&](int i) { return slurp(d / (std::to_string(i) + ".log")); };
  ASSERT_TRUE(wait_until([&] { return log_of(0).find("step    30/") != std::string::npos ||
                                      log_of(1).find("step    30/") != std::string::npos ||
                                      log_of(2).find("step    30/") != std::string::npos; },
                         pids[0]))
      << log_of(0);
  int node0 = -1;
  for (int i = 0; i < 3; ++i)
    if (log_of(i).find("is node 0 of 3") != std::string::npos) node0 = i;
  ASSERT_GE(node0, 0);
  const int victim = (node0 + 1) % 3, other = (node0 + 2) % 3;
  const std::vector<pid_t> before0 = live::children(pids[size_t(node0)]),
                           before1 = live::children(pids[size_t(other)]);
  ASSERT_EQ(before0.size(), 1u);
  ASSERT_EQ(before1.size(), 1u);
  ::kill(pids[size_t(victim)], SIGKILL);
  agents.wait(pids[size_t(victim)]);
  ASSERT_TRUE(wait_until([&] { return log_of(node0).find("resize: ") != std::string::npos; },
                         pids[size_t(node0)]))
      << log_of(node0);
  // The survivors' workers are the processes they were before the loss.
  EXPECT_EQ(live::children(pids[size_t(node0)]), before0);
  EXPECT_EQ(live::children(pids[size_t(other)]), before1);
  for (int i : {node0, other}) EXPECT_EQ(agents.wait(pids[size_t(i)]), 0) << log_of(i);
  const std::string lead = log_of(node0);
  EXPECT_NE(lead.find("resize: epoch 1 -> 2, world 3 -> 2"), std::string::npos) << lead;
  live::expect_state_from_survivors(lead, 2);  // the kill may leave one a step behind
  expect_same_losses(d / "one" / "out" / "metrics.jsonl", d / "out" / "metrics.jsonl", steps,
                     false, 1e-6);
  fs::remove_all(d);
}

}  // namespace
}  // namespace weft::test
