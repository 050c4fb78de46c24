// Online resize with real agents and workers on this machine (one agent per node, nodes on
// loopback): elastic.on_change: reshard. Workers are SIGKILLed and nodes join mid-run; the
// survivors keep their processes (the same PIDs before and after), the router moves the
// live state into the new world's layout, and the run's losses equal one process's step
// for step. No timing thresholds: every wait is bounded by a patience far beyond its need.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include "comm/elastic/membership_record.h"
#include "comm/store/tcp_store.h"
#include "core/io/metrics.h"
#include "tests/support/agent_tests.h"
#include "tests/support/metrics_compare.h"
#include "tests/support/run_weft.h"

namespace weft::test {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using WorldEpoch = std::pair<int, int>;

const std::string kConfig = std::string(WEFT_SOURCE_DIR) + "/configs/gpt-layout.yaml";
const std::string kToken = "live-resize-test-token";
// A node silent for 2 s is lost; the first epoch forms when all the nodes a test starts
// have arrived (last call 15 s, beyond any start-up delay; max nodes ends it at once).
const std::string kConf =
    "heartbeat_interval=0.5,heartbeat_timeout=2,last_call_timeout=15,join_timeout=60";
constexpr double kPatience = 120;
// Data parallelism over 2, 3 or 4 ranks regroups the sums of one process's 12 micro-batches.
constexpr double kRelDp = 1e-6;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

bool poll_until(const std::function<bool()>& done, double limit = kPatience) {
  const auto t0 = Clock::now();
  while (!done()) {
    if (seconds_since(t0) > limit) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// The workers the agent `pid` started: its children with a rank in their environment (the
// agent also forks a guardian, which has none).
std::vector<pid_t> children(pid_t pid) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string n = e.path().filename().string();
    if (n.find_first_not_of("0123456789") != std::string::npos) continue;
    std::istringstream in(slurp(e.path() / "stat"));
    std::string pidtext, comm, state;
    long ppid = 0;
    in >> pidtext >> comm >> state >> ppid;  // comm has no spaces: workers are "weft"
    if (ppid == pid && slurp(e.path() / "environ").find("WEFT_RANK=") != std::string::npos)
      out.push_back(pid_t(std::stol(n)));
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> train_args(const fs::path& out, int steps,
                                    const std::vector<std::string>& sets) {
  std::vector<std::string> a = {"--config", kConfig,
                                "--set",    "train.steps=" + std::to_string(steps),
                                "--set",    "train.warmup_steps=1",
                                "--set",    "train.log_every=1",
                                "--set",    "train.eval_every=1000000",
                                "--set",    "train.global_batch=24",
                                "--set",    "train.micro_batch=2",
                                "--set",    "train.out_dir=" + out.string()};
  for (const std::string& s : sets) a.insert(a.end(), {"--set", s});
  return a;
}

// One process, the same job: the numbers every resized run must give.
fs::path reference_run(const fs::path& dir, int steps, const std::vector<std::string>& sets) {
  const fs::path out = dir / "one";
  std::string cmd = std::string(WEFT_BINARY) + " train";
  for (const std::string& a : train_args(out, steps, sets)) cmd += " '" + a + "'";
  CommandResult r = run_command("OMP_NUM_THREADS=1 " + cmd);
  EXPECT_EQ(r.code, 0) << r.out;
  return out / "metrics.jsonl";
}

// One job's agents on loopback, one node each (`nproc` workers).
struct LiveJob {
  fs::path dir;
  std::string id;
  int port = free_port();
  int steps = 600;  // 4 ranks make about 50 steps/s on two cores: joins come in time
  int nproc = 1;
  std::string nnodes = "2:4";
  std::vector<std::string> sets;  // the job's --set overrides beyond train_args'
  Agents agents{{"WEFT_JOB_TOKEN=" + kToken, "OMP_NUM_THREADS=1"}};
  std::vector<fs::path> logs;

  fs::path out() const { return dir / "out"; }
  fs::path metrics() const { return out() / "metrics.jsonl"; }

  int start() {
    const fs::path log = dir / ("agent" + std::to_string(logs.size()) + ".log");
    std::vector<std::string> argv = {"run", "--nnodes", nnodes, "--nproc-per-node",
                                     std::to_string(nproc), "--max-restarts", "0",
                                     "--rdzv-backend", "c10d", "--rdzv-id", id,
                                     "--rdzv-endpoint", "127.0.0.1:" + std::to_string(port),
                                     "--rdzv-conf", kConf, "--", WEFT_BINARY, "train"};
    std::vector<std::string> s = sets;
    s.push_back("elastic.on_change=reshard");
    for (const std::string& x : train_args(out(), steps, s)) argv.push_back(x);
    agents.start(argv, log);
    logs.push_back(log);
    return int(logs.size()) - 1;
  }
  pid_t pid(int k) const { return agents.pids.at(size_t(k)); }
  std::string all_logs() const {
    std::string s;
    for (size_t k = 0; k < logs.size(); ++k) s += "--- agent " + std::to_string(k) + "\n" + slurp(logs[k]);
    return s;
  }
  // Waiting nodes before epoch 1 (the record in the store the first agent serves).
  size_t waiting() {
    try {
      comm::TCPStore store(comm::TCPStoreOptions{"127.0.0.1", uint16_t(port),
                                                 std::chrono::milliseconds(5'000), kToken});
      const std::string key = "rdzv/" + id + "/state";
      if (!store.check({key})) return 0;
      return comm::decode(comm::to_string(store.get(key)), key).spares.size();
    } catch (const std::exception&) {
      return 0;
    }
  }
  // Starts `n` agents one after the other, so that agent i gets node rank i.
  void start_in_order(int n) {
    for (int i = 0; i < n; ++i) {
      start();
      if (i + 1 < n) {
        ASSERT_TRUE(poll_until([&] { return int(waiting()) == i + 1; }, 60)) << all_logs();
      }
    }
  }
  std::vector<core::io::MetricsRow> rows() const {
    try {
      return core::io::read_metrics(metrics().string());
    } catch (const std::exception&) {
      return {};
    }
  }
  // Waits until a metrics line of world `world` exists and `more` lines have followed it.
  bool wait_world(int world, size_t more = 0) {
    return poll_until([&] {
      std::vector<core::io::MetricsRow> r = rows();
      for (size_t i = 0; i < r.size(); ++i)
        if (!r[i].is_validation() && int(r[i].at("world")) == world) return r.size() >= i + 1 + more;
      return false;
    });
  }
  bool wait_steps(size_t n) { return poll_until([&] { return rows().size() >= n; }); }
  // (world, epoch) of each run of metrics lines, with their counts.
  std::vector<std::pair<WorldEpoch, int>> phases() const {
    std::vector<std::pair<WorldEpoch, int>> out;
    for (const core::io::MetricsRow& r : rows()) {
      if (r.is_validation()) continue;
      WorldEpoch we{int(r.at("world")), int(r.at("epoch"))};
      if (out.empty() || out.back().first != we) out.push_back({we, 0});
      ++out.back().second;
    }
    return out;
  }
  std::optional<int> wait(int k, double limit = kPatience) {
    std::optional<int> code;
    poll_until(
        [&] {
          int status = 0;
          if (::waitpid(pid(k), &status, WNOHANG) != pid(k)) return false;
          agents.pids[size_t(k)] = -1;
          code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          return true;
        },
        limit);
    return code;
  }
};

std::string phases_text(const std::vector<std::pair<WorldEpoch, int>>& p) {
  std::string s;
  for (const auto& [we, n] : p)
    s += "(world " + std::to_string(we.first) + ", epoch " + std::to_string(we.second) + ") x" +
         std::to_string(n) + " ";
  return s;
}

// dp4 -> dp2 (two workers SIGKILLed; their nodes leave) -> dp3 (a node joins): the survivors
// keep their processes, take the state from each other (every DP replica holds all of it),
// and the run equals one process's.
TEST(LiveResize, Dp4ToDp2ByKillsThenDp3ByAJoinKeepsSurvivorsAndTheNumbers) {
  LiveJob job;
  job.dir = agent_test_dir("live_resize", "dp");
  job.id = "live-dp";
  job.sets = {"parallel.dp=auto"};
  const fs::path ref = reference_run(job.dir, job.steps, job.sets);
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
  expect_same_losses(ref, job.metrics(), size_t(job.steps), false, kRelDp);
  const std::string lead = slurp(job.logs[0]);
  EXPECT_NE(lead.find("world 4 -> 2"), std::string::npos) << lead;
  EXPECT_NE(lead.find("state from 2 holders through the router"), std::string::npos) << lead;
  EXPECT_NE(lead.find("world 2 -> 3"), std::string::npos) << lead;
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);  // kept for a look otherwise
}

// A graceful leave (SIGTERM to one agent: a preemption notice) under ZeRO-1: the leaving
// node holds the only copy of a third of Adam's moments, so it hands them over in the new
// epoch's first world before its worker exits 0; dp3 -> dp2 goes on from the survivors'
// state with no checkpoint at all, and equals one process.
TEST(LiveResize, GracefulLeaveHandsItsZeroShardOverAndExitsZero) {
  LiveJob job;
  job.dir = agent_test_dir("live_resize", "leave");
  job.id = "live-leave";
  job.nnodes = "2:3";
  job.steps = 400;
  job.sets = {"parallel.dp=auto", "parallel.zero=1"};
  const fs::path ref = reference_run(job.dir, job.steps, job.sets);
  job.start_in_order(3);
  ASSERT_TRUE(job.wait_steps(20)) << job.all_logs();
  std::vector<std::vector<pid_t>> before(3);
  for (int k = 0; k < 3; ++k) before[size_t(k)] = children(job.pid(k));
  ::kill(job.pid(2), SIGTERM);
  ASSERT_TRUE(job.wait_world(2, 10)) << phases_text(job.phases()) << job.all_logs();
  std::optional<int> code = job.wait(2);
  ASSERT_TRUE(code) << job.all_logs();
  EXPECT_EQ(*code, 0) << job.all_logs();
  for (int k : {0, 1}) EXPECT_EQ(children(job.pid(k)), before[size_t(k)]) << "agent " << k;
  for (int k : {0, 1}) {
    std::optional<int> c = job.wait(k);
    ASSERT_TRUE(c) << job.all_logs();
    EXPECT_EQ(*c, 0) << job.all_logs();
  }
  const auto p = job.phases();
  ASSERT_EQ(p.size(), 2u) << phases_text(p);
  EXPECT_EQ(p[0].first, WorldEpoch(3, 1)) << phases_text(p);
  EXPECT_EQ(p[1].first.first, 2) << phases_text(p);
  expect_same_losses(ref, job.metrics(), size_t(job.steps), false, kRelDp);
  const std::string lead = slurp(job.logs[0]), leaver = slurp(job.logs[2]);
  EXPECT_NE(lead.find("world 3 -> 2"), std::string::npos) << lead;
  // The leaver is one of the holders: its shard of the moments exists nowhere else.
  EXPECT_NE(lead.find("state from 3 holders through the router"), std::string::npos) << lead;
  EXPECT_NE(leaver.find("left the job after handing its state over (through the router)"),
            std::string::npos)
      << leaver;
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);
}

}  // namespace
}  // namespace weft::test
