// `weft run` on several nodes (a fixed count), played by several agents on this machine:
// they meet at --rdzv-endpoint (the first to bind hosts the store), train one job whose
// metrics equal a single process's, and end together when a node is lost or fails.
// No timing thresholds: every wait is bounded by the test's ctest timeout.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/io/metrics.h"
#include "tests/support/metrics_compare.h"
#include "tests/support/agent_tests.h"
#include "tests/support/run_weft.h"

namespace weft::test {
namespace {

namespace fs = std::filesystem;
const std::string kConfig = std::string(WEFT_SOURCE_DIR) + "/configs/gpt-layout.yaml";
const std::string kToken = "WEFT_JOB_TOKEN=multinode-test-token";

fs::path temp_dir(const std::string& name) { return agent_test_dir("nodes", name); }

// The agents of one test, with the job token.
struct NodeAgents : Agents {
  NodeAgents() : Agents({kToken}) {}
};

std::vector<std::string> agent_args(int port, const std::string& id,
                                    const std::vector<std::string>& command,
                                    const std::vector<std::string>& extra = {}) {
  std::vector<std::string> a = {"run",  "--nnodes",  "2", "--nproc-per-node", "1", "--rdzv-backend",
                                "c10d", "--rdzv-id", id};
  a.push_back("--rdzv-endpoint");
  a.push_back("127.0.0.1:" + std::to_string(port));
  a.insert(a.end(), extra.begin(), extra.end());
  a.push_back("--");
  a.insert(a.end(), command.begin(), command.end());
  return a;
}

std::vector<std::string> train(const fs::path& out, int steps) {
  return {"weft",     "train",
          "--config", kConfig,
          "--set",    "train.steps=" + std::to_string(steps),
          "--set",    "train.warmup_steps=1",
          "--set",    "train.log_every=1",
          "--set",    "train.eval_every=1000000",
          "--set",    "parallel.dp=2",
          "--set",    "train.out_dir=" + out.string()};
}

TEST(MultiNode, TwoAgentsTrainLikeOneProcess) {
  fs::path d = temp_dir("match");
  CommandResult one = run_weft("train --config " + kConfig +
                               " --set train.steps=4 --set train.warmup_steps=1 --set "
                               "train.log_every=1 --set train.eval_every=1000000 --set "
                               "train.out_dir=" +
                               (d / "one").string());
  ASSERT_EQ(one.code, 0) << one.out;
  NodeAgents agents;
  const int port = free_port();
  pid_t a = agents.start(agent_args(port, "match", train(d / "two", 4)), d / "a.log");
  pid_t b = agents.start(agent_args(port, "match", train(d / "two", 4)), d / "b.log");
  int ca = agents.wait(a), cb = agents.wait(b);
  std::string la = slurp(d / "a.log"), lb = slurp(d / "b.log");
  ASSERT_EQ(ca, 0) << la << "\n---\n" << lb;
  ASSERT_EQ(cb, 0) << la << "\n---\n" << lb;
  // Exactly one of them hosted the store; each got its own node rank.
  EXPECT_NE((la + lb).find("serves the rendezvous store on 127.0.0.1:" + std::to_string(port)),
            std::string::npos);
  EXPECT_NE((la + lb).find("is node 0 of 2"), std::string::npos) << la << lb;
  EXPECT_NE((la + lb).find("is node 1 of 2"), std::string::npos) << la << lb;
  test::expect_same_losses(d / "one" / "metrics.jsonl", d / "two" / "metrics.jsonl", 4,
                           /*validation=*/false, 1e-7);
  auto rows = core::io::read_metrics((d / "two" / "metrics.jsonl").string());
  EXPECT_EQ(rows.at(0).at("world"), 2);
  fs::remove_all(d);
}

TEST(MultiNode, LostNodeStopsTheOthersNamingIt) {
  fs::path d = temp_dir("lost");
  NodeAgents agents;
  const int port = free_port();
  const std::vector<std::string> conf = {"--rdzv-conf",
                                         "heartbeat_interval=0.5,heartbeat_timeout=3"};
  pid_t a = agents.start(agent_args(port, "lost", train(d / "out", 1000000), conf), d / "a.log");
  ASSERT_TRUE(wait_for(d / "a.log", "serves the rendezvous store", a)) << slurp(d / "a.log");
  pid_t b = agents.start(agent_args(port, "lost", train(d / "out", 1000000), conf), d / "b.log");
  ASSERT_TRUE(wait_for(d / "a.log", "| loss", a)) << slurp(d / "a.log");
  ::kill(b, SIGKILL);  // the node's agent dies; its workers die with it
  agents.wait(b);
  int ca = agents.wait(a);
  std::string la = slurp(d / "a.log");
  EXPECT_NE(ca, 0) << la;
  EXPECT_NE(la.find("lost node " + agent_node_id(b)), std::string::npos) << la;
  EXPECT_NE(la.find("weft run: failed: lost node " + agent_node_id(b)), std::string::npos) << la;
  fs::remove_all(d);
}

// The store lives in one agent: when that node dies, the others lose the store at once and
// say whose it was.
TEST(MultiNode, LostStoreHostIsNamed) {
  fs::path d = temp_dir("host");
  NodeAgents agents;
  const int port = free_port();
  pid_t a = agents.start(agent_args(port, "host", train(d / "out", 1000000)), d / "a.log");
  ASSERT_TRUE(wait_for(d / "a.log", "serves the rendezvous store", a)) << slurp(d / "a.log");
  pid_t b = agents.start(agent_args(port, "host", train(d / "out", 1000000)), d / "b.log");
  ASSERT_TRUE(wait_for(d / "b.log", "is node", b)) << slurp(d / "b.log");
  ASSERT_TRUE(wait_for(d / "a.log", "| loss", a)) << slurp(d / "a.log");
  ::kill(a, SIGKILL);
  agents.wait(a);
  int cb = agents.wait(b);
  std::string lb = slurp(d / "b.log");
  EXPECT_NE(cb, 0) << lb;
  EXPECT_NE(lb.find("weft run: failed: lost the rendezvous store at 127.0.0.1:" +
                    std::to_string(port) + " (hosted by node " + agent_node_id(a)),
            std::string::npos)
      << lb;
  fs::remove_all(d);
}

TEST(MultiNode, WorkerFailureOnOneNodeStopsTheOthers) {
  fs::path d = temp_dir("fail");
  NodeAgents agents;
  const int port = free_port();
  // Node 1's worker fails (after a second, so that both agents are usually past the
  // rendezvous by then; either way is checked); node 0's would run for ten minutes.
  const std::vector<std::string> cmd = {"sh", "-c",
                                        "if [ \"$GROUP_RANK\" = 1 ]; then sleep 1; exit 3; "
                                        "fi; exec sleep 600"};
  pid_t a = agents.start(agent_args(port, "fail", cmd), d / "a.log");
  pid_t b = agents.start(agent_args(port, "fail", cmd), d / "b.log");
  int ca = agents.wait(a), cb = agents.wait(b);
  std::string la = slurp(d / "a.log"), lb = slurp(d / "b.log");
  // Which agent got node rank 1 is up to the rendezvous.
  bool a_failed = la.find("is node 1 of 2") != std::string::npos;
  const std::string& failed = a_failed ? la : lb;
  const std::string& other = a_failed ? lb : la;
  EXPECT_EQ(a_failed ? ca : cb, 3) << la << "\n---\n" << lb;
  EXPECT_EQ(a_failed ? cb : ca, 1) << la << "\n---\n" << lb;
  EXPECT_NE(failed.find("weft run: rank 1 exited with code 3"), std::string::npos) << failed;
  // The other agent stops its workers and names the failed node's root cause (or, when the
  // job closed before that agent saw itself a member, refuses to start with that reason).
  EXPECT_TRUE(other.find("the job was stopped by another node: node ") != std::string::npos ||
              other.find("may not join; the job is over") != std::string::npos)
      << other;
  EXPECT_NE(other.find("rank 1 (pid"), std::string::npos) << other;  // the global rank
  EXPECT_NE(other.find("exited with code 3"), std::string::npos) << other;
  fs::remove_all(d);
}

// --max-restarts with elastic.on_change: restart: a worker dies on node 1 mid-run; its agent
// asks for a new round, both nodes restart their workers, which resume from the latest
// checkpoint; the metrics equal a single process's, each step once.
// `on_change`: the job's elastic.on_change ("" = the default, reshard). At a fixed node
// count a node cannot leave and rejoin (the others could not form an epoch without it):
// under restart a failed worker restarts every node's workers from the latest checkpoint;
// under reshard it is replaced in place (node_agent.h) and the others keep training.
void failed_worker_restarts_every_node(const std::string& name, const std::string& on_change) {
  fs::path d = temp_dir(name);
  const int steps = 200;
  std::string one_cmd = std::string(WEFT_BINARY);
  for (const std::string& a : train(d / "one", steps)) one_cmd += a == "weft" ? "" : " " + a;
  CommandResult one = run_command(one_cmd + " --set parallel.dp=1");
  ASSERT_EQ(one.code, 0) << one.out;
  std::string cmd = std::string(WEFT_BINARY);
  for (const std::string& a : train(d / "two", steps)) cmd += a == "weft" ? "" : " " + a;
  cmd += " --set checkpoint.dir=" + (d / "ckpt").string() +
         " --set checkpoint.every=10 --set checkpoint.async=false" +
         (on_change.empty() ? "" : " --set elastic.on_change=" + on_change);
  // Attempt 0 on node 1: kill the trainer once step 50's checkpoint exists, then fail.
  const std::string worker =
      "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] && [ \"$GROUP_RANK\" = 1 ]; then " + cmd +
      " & t=$!; while [ ! -d " + (d / "ckpt" / "step-00000050").string() +
      " ]; do sleep 0.02; done; kill -9 $t; exit 5; fi; exec " + cmd;
  NodeAgents agents;
  const int port = free_port();
  const std::vector<std::string> extra = {"--max-restarts", "1"};
  pid_t a = agents.start(agent_args(port, name, {"sh", "-c", worker}, extra), d / "a.log");
  pid_t b = agents.start(agent_args(port, name, {"sh", "-c", worker}, extra), d / "b.log");
  int ca = agents.wait(a), cb = agents.wait(b);
  std::string logs = slurp(d / "a.log") + "\n---\n" + slurp(d / "b.log");
  ASSERT_EQ(ca, 0) << logs;
  ASSERT_EQ(cb, 0) << logs;
  if (on_change == "restart") {
    EXPECT_NE(logs.find("failed: exited with code 5; restarting the workers (1 of --max-restarts 1 used)"),
              std::string::npos)
        << logs;
    EXPECT_NE(logs.find("restart round 1 asked for by node "), std::string::npos) << logs;
    EXPECT_NE(logs.find("weft train: restart 1 (membership epoch 1, world 2): resuming"),
              std::string::npos)
        << logs;
  } else {
    EXPECT_NE(logs.find("exited with code 5; replaced in place (1 of --max-restarts 1 used), the "
                        "other workers keep running"),
              std::string::npos)
        << logs;
    EXPECT_NE(logs.find("replaced by a new worker"), std::string::npos) << logs;
    EXPECT_EQ(logs.find("restart round 1 asked for by node "), std::string::npos) << logs;
  }
  test::expect_same_losses(d / "one" / "metrics.jsonl", d / "two" / "metrics.jsonl", steps,
                           /*validation=*/false, 2e-7);
  fs::remove_all(d);
}

TEST(MultiNode, FailedWorkerRestartsEveryNodeFromTheLatestCheckpoint) {
  failed_worker_restarts_every_node("restart", "restart");
}

// The default (reshard) at a fixed --nnodes 2: it hung before, the failed node waiting as a
// spare of the full epoch it had left while the other could not form one without it; then it
// restarted every node; now the failed worker alone is replaced.
TEST(MultiNode, FailedWorkerAtAFixedNodeCountIsReplacedInPlaceUnderReshard) {
  failed_worker_restarts_every_node("restart_live", "");
}

// torchrun's static rendezvous: each node says its rank; node rank 0 hosts the store at
// --master-addr:--master-port (a node started before it waits for it); a second node with a
// taken rank is refused naming --node-rank.
TEST(MultiNode, StaticRendezvousKeepsTheGivenNodeRanks) {
  fs::path d = temp_dir("static");
  NodeAgents agents;
  const int port = free_port();
  auto node = [&](int rank, const std::string& command) {
    return std::vector<std::string>{"run", "--rdzv-backend", "static", "--nnodes", "2",
                                    "--node-rank", std::to_string(rank), "--master-addr",
                                    "127.0.0.1", "--master-port", std::to_string(port), "--",
                                    "sh", "-c", command};
  };
  const std::string say = "echo RANK=$RANK GROUP_RANK=$GROUP_RANK; sleep 1";
  pid_t b = agents.start(node(1, say), d / "b.log");  // before node 0's store exists
  pid_t a = agents.start(node(0, say), d / "a.log");
  ASSERT_TRUE(wait_for(d / "b.log", "is node 1 of 2", b)) << slurp(d / "b.log");
  pid_t c = agents.start(node(1, "true"), d / "c.log");
  int cc = agents.wait(c);
  int ca = agents.wait(a), cb = agents.wait(b);
  std::string la = slurp(d / "a.log"), lb = slurp(d / "b.log"), lc = slurp(d / "c.log");
  EXPECT_EQ(ca, 0) << la;
  EXPECT_EQ(cb, 0) << lb;
  EXPECT_NE(la.find("serves the rendezvous store on 127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << la;
  EXPECT_NE(la.find("[rank 0] RANK=0 GROUP_RANK=0"), std::string::npos) << la;
  EXPECT_NE(lb.find("[rank 1] RANK=1 GROUP_RANK=1"), std::string::npos) << lb;
  EXPECT_EQ(cc, 2) << lc;
  EXPECT_NE(lc.find("--node-rank: node rank 1 is already taken by node " + agent_node_id(b)),
            std::string::npos)
      << lc;
  fs::remove_all(d);
}

// --rdzv-conf is_host overrides "the first agent to bind hosts the store".
TEST(MultiNode, IsHostDecidesWhichAgentServesTheStore) {
  fs::path d = temp_dir("ishost");
  NodeAgents agents;
  const int port = free_port();
  // (--monitor-interval: how often each agent checks the rendezvous.)
  pid_t a = agents.start(
      agent_args(port, "ishost", {"true"}, {"--rdzv-conf", "is_host=0", "--monitor-interval", "0.05"}),
      d / "a.log");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a would have bound by now
  pid_t b = agents.start(agent_args(port, "ishost", {"true"}, {"--rdzv-conf", "is_host=1"}),
                         d / "b.log");
  int ca = agents.wait(a), cb = agents.wait(b);
  std::string la = slurp(d / "a.log"), lb = slurp(d / "b.log");
  EXPECT_EQ(ca, 0) << la;
  EXPECT_EQ(cb, 0) << lb;
  EXPECT_EQ(la.find("serves the rendezvous store"), std::string::npos) << la;
  EXPECT_NE(lb.find("serves the rendezvous store"), std::string::npos) << lb;
  fs::remove_all(d);
}

// Starts three agents running `args` (the first serves the store; agent i logs to i.log in
// `d`), their pids in `p`, and waits until every one's worker says it is in world 3, epoch 1.
::testing::AssertionResult start_three(NodeAgents& agents, const std::vector<std::string>& args,
                                       const fs::path& d, std::vector<pid_t>& p) {
  for (int i = 0; i < 3; ++i) {
    p.push_back(agents.start(args, d / (std::to_string(i) + ".log")));
    if (i == 0 && !wait_for(d / "0.log", "serves the rendezvous store", p[0]))
      return ::testing::AssertionFailure() << "agent 0 serves no store\n" << slurp(d / "0.log");
  }
  for (int i = 0; i < 3; ++i) {
    const fs::path log = d / (std::to_string(i) + ".log");
    if (!wait_for(log, "world 3 epoch 1", p[size_t(i)]))
      return ::testing::AssertionFailure() << "agent " << i << " not in epoch 1\n" << slurp(log);
  }
  return ::testing::AssertionSuccess();
}

// Nodes beyond MAX wait as spares; when a member is lost, the survivors (a majority) admit
// the spare in the next epoch, which takes the lost node's place. The lost member's scratch
// folder is removed by the next weft run on the machine.
TEST(MultiNode, SpareBeyondMaxIsAdmittedWhenAMemberIsLost) {
  fs::path d = temp_dir("spare");
  NodeAgents agents;
  const int port = free_port();
  // A worker ends only in epoch 2: one of epoch 1 must be restarted by its agent.
  const std::string worker = "echo world $GROUP_WORLD_SIZE epoch $WEFT_RDZV_EPOCH; "
                             "echo notices in $WEFT_EPOCH_FILE; while [ ! -f " +
                             (d / "done").string() +
                             " ] || [ $WEFT_RDZV_EPOCH != 2 ]; do sleep 0.05; done";
  auto args = [&] {
    std::vector<std::string> a = agent_args(
        port, "spare", {"sh", "-c", worker},
        {"--max-restarts", "1", "--rdzv-conf",
         "heartbeat_interval=0.5,heartbeat_timeout=2,last_call_timeout=0.5,join_timeout=60"});
    a[2] = "2:3";  // --nnodes
    return a;
  };
  std::vector<pid_t> p;
  ASSERT_TRUE(start_three(agents, args(), d, p));
  pid_t spare = agents.start(args(), d / "spare.log");
  // Registered, not only announced: a member lost before the spare is in the record forms an
  // epoch without it (and the workers here wait for epoch 2 with the spare in).
  ASSERT_TRUE(wait_for(d / "spare.log", "is registered as a spare of epoch 1", spare))
      << slurp(d / "spare.log");
  // The member about to be killed keeps its epoch notices in a scratch folder of its own,
  // named for its pid: a killed agent cannot remove it, the next weft run on the machine does.
  const std::string log2 = slurp(d / "2.log");
  const size_t at = log2.find("notices in ");
  ASSERT_NE(at, std::string::npos) << log2;
  const fs::path notices =
      fs::path(log2.substr(at + 11, log2.find('\n', at) - at - 11)).parent_path();
  EXPECT_TRUE(notices.filename().string().starts_with("weft_run_" + std::to_string(p[2]) + "_"))
      << notices;
  EXPECT_TRUE(fs::is_directory(notices)) << notices;
  ::kill(p[2], SIGKILL);  // a member that does not host the store
  agents.wait(p[2]);
  ASSERT_TRUE(wait_for(d / "spare.log", "world 3 epoch 2", spare)) << slurp(d / "spare.log");
  std::ofstream(d / "done") << "1";
  EXPECT_EQ(agents.wait(spare), 0) << slurp(d / "spare.log");
  for (int i = 0; i < 2; ++i) {
    const int code = agents.wait(p[size_t(i)]);  // then its log is complete
    const std::string log = slurp(d / (std::to_string(i) + ".log"));
    EXPECT_EQ(code, 0) << log;
    EXPECT_NE(log.find("membership changed: epoch 1 -> 2, 3 -> 3 nodes (lost " +
                       agent_node_id(p[2]) + ") (joined " + agent_node_id(spare) + ")"),
              std::string::npos)
        << log;
  }
  const CommandResult next = run_weft("run --standalone --nproc-per-node 1 -- true");
  EXPECT_EQ(next.code, 0) << next.out;
  EXPECT_FALSE(fs::exists(notices)) << notices << ": the killed member's folder stayed";
  fs::remove_all(d);
}

// A member lost under elastic.on_change: restart: the others' workers cannot end their step
// (its collectives wait on the lost node, or it computes for seconds before the first one
// fails), so they are SIGKILLed at once rather than SIGTERMed and given --grace. Workers that
// ignore SIGTERM stand for them: with a grace of 120 s, far beyond the wait below, epoch 2
// starts only because nobody waits for it.
TEST(MultiNode, ALostMembersPeersAreKilledAtOnceNotGivenTheGrace) {
  fs::path d = temp_dir("lostkill");
  NodeAgents agents;
  const int port = free_port();
  const std::string worker = "trap '' TERM; echo world $GROUP_WORLD_SIZE epoch $WEFT_RDZV_EPOCH; "
                             "while [ ! -f " + (d / "done").string() +
                             " ] || [ $WEFT_RDZV_EPOCH != 2 ]; do sleep 0.05; done";
  std::vector<std::string> args = agent_args(
      port, "lostkill", {"sh", "-c", worker},
      {"--max-restarts", "1", "--grace", "120", "--rdzv-conf",
       "heartbeat_interval=0.5,heartbeat_timeout=2,last_call_timeout=0.5,join_timeout=60"});
  args[2] = "2:3";  // --nnodes
  std::vector<pid_t> p;
  ASSERT_TRUE(start_three(agents, args, d, p));
  const std::string lost = agent_node_id(p[2]);
  ::kill(p[2], SIGKILL);
  agents.wait(p[2]);
  for (int i = 0; i < 2; ++i) {
    const fs::path log = d / (std::to_string(i) + ".log");
    const auto t0 = std::chrono::steady_clock::now();
    while (slurp(log).find("world 2 epoch 2") == std::string::npos &&
           std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const std::string text = slurp(log);
    ASSERT_NE(text.find("world 2 epoch 2"), std::string::npos) << text;
    EXPECT_NE(text.find("(lost " + lost + "); stopping the workers (SIGKILL: their world lost a "
                        "member, so their step cannot end)"),
              std::string::npos)
        << text;
  }
  std::ofstream(d / "done") << "1";
  for (int i = 0; i < 2; ++i) EXPECT_EQ(agents.wait(p[size_t(i)]), 0) << slurp(d / (std::to_string(i) + ".log"));
  fs::remove_all(d);
}

TEST(MultiNode, WrongTokenFailsAtOnceNamingIt) {
  fs::path d = temp_dir("token");
  NodeAgents agents;
  const int port = free_port();
  pid_t a = agents.start(agent_args(port, "token", {"true"}), d / "a.log");
  ASSERT_TRUE(wait_for(d / "a.log", "serves the rendezvous store", a)) << slurp(d / "a.log");
  pid_t b = agents.start(agent_args(port, "token", {"true"}), d / "b.log",
                         {"WEFT_JOB_TOKEN=not-the-token"});
  int cb = agents.wait(b);
  std::string lb = slurp(d / "b.log");
  EXPECT_NE(cb, 0) << lb;
  EXPECT_NE(lb.find("WEFT_JOB_TOKEN"), std::string::npos) << lb;
  EXPECT_EQ(lb.find("is node"), std::string::npos) << lb;
  fs::remove_all(d);
}

TEST(MultiNode, RefusesWithoutTokenOrRunId) {
  CommandResult no_token =
      run_command("env -u WEFT_JOB_TOKEN -u WEFT_JOB_TOKEN_FILE " + std::string(WEFT_BINARY) +
                  " run --nnodes 2 --rdzv-endpoint 127.0.0.1:1 --rdzv-id j -- true");
  EXPECT_EQ(no_token.code, 2) << no_token.out;
  EXPECT_NE(no_token.out.find("WEFT_JOB_TOKEN"), std::string::npos) << no_token.out;
  CommandResult no_id = run_command("WEFT_JOB_TOKEN=t " + std::string(WEFT_BINARY) +
                                    " run --nnodes 2 --rdzv-endpoint 127.0.0.1:1 -- true");
  EXPECT_EQ(no_id.code, 2) << no_id.out;
  EXPECT_NE(no_id.out.find("--rdzv-id"), std::string::npos) << no_id.out;
}

}  // namespace
}  // namespace weft::test
