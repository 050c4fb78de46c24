// Elastic `weft run --nnodes 2:3 --max-restarts 3` with elastic.on_change: restart (the
// online resize that is the default: live_resize_test.cc) on hosts that are network namespaces
// (tests/support/netns.h): one agent per host, the store in host 0's agent, checkpoint.dir and
// the out dir shared (the hosts share the filesystem). A node killed, frozen and unplugged,
// cut off by a partition, or joining: the others restart their workers for the new world,
// which resume from the latest checkpoint, and the job's metrics equal one process's step for
// step; a node cut off stops itself and never rejoins as a second brain.
// No timing thresholds: detection times are printed; every wait is bounded.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

#include "comm/elastic/membership_record.h"
#include "comm/store/tcp_store.h"
#include "core/io/metrics.h"
#include "tests/support/metrics_compare.h"
#include "tests/support/agent_tests.h"
#include "tests/support/netns.h"
#include "tests/support/run_weft.h"

namespace weft::test {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using WorldEpoch = std::pair<int, int>;  // a metrics line's (world, epoch)

const std::string kConfig = std::string(WEFT_SOURCE_DIR) + "/configs/gpt-layout.yaml";
const std::string kToken = "netns-elastic-test-token";
constexpr int kPort = 29400;  // every host has ports of its own
// Long enough for a loss at checkpoint 100 and a join 50 steps after the restart, with a few
// seconds to spare (three ranks make 50 to 100 steps/s on two cores); short enough that each
// test takes 10 to 20 s, under 30 s on two loaded cores.
constexpr int kSteps = 300;
constexpr int kMaxRestarts = 3;
// Data parallelism over 2 or 3 ranks regroups the sums of one process's 6 micro-batches:
// these runs measure up to 1.3e-7 relative (the lead's 600-step loopback run 2.5e-7).
constexpr double kRel = 3e-7;
// A node silent for 2 s is lost (and a member waits no longer for a store reply). last_call
// 15 s: agents started one after the other form one epoch of all three as soon as the third
// arrives, however slowly a loaded machine starts it (kQuickLastCall where two start alone).
// join_timeout 30 s: a job that cannot form fails well within the test's patience.
const std::string kConf =
    "heartbeat_interval=0.5,heartbeat_timeout=2,last_call_timeout=15,join_timeout=30";
const std::string kQuickLastCall =
    "heartbeat_interval=0.5,heartbeat_timeout=2,last_call_timeout=1,join_timeout=30";
// Any wait of the test on the job: far beyond what it needs, well inside ctest's timeout.
constexpr double kPatience = 100;

#define SKIP_WITHOUT_HOSTS()                                                                \
  do {                                                                                      \
    std::string why;                                                                        \
    if (!VirtualHosts::available(&why)) GTEST_SKIP() << why;                                \
    ASSERT_EQ(::access(WEFT_BINARY, X_OK), 0) << WEFT_BINARY << " is built with the tests"; \
  } while (0)

fs::path temp_dir(const std::string& name) { return agent_test_dir("netns_elastic", name); }

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Polls `done` every 20 ms for at most `limit` seconds.
bool poll_until(const std::function<bool()>& done, double limit = kPatience) {
  const auto t0 = Clock::now();
  while (!done()) {
    if (seconds_since(t0) > limit) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// `weft train`'s arguments; checkpoints every 10 steps into `ckpt` unless it is empty.
std::vector<std::string> train_args(const fs::path& out, const fs::path& ckpt) {
  std::vector<std::string> a = {"--config", kConfig,
                                "--set",    "train.steps=" + std::to_string(kSteps),
                                "--set",    "train.warmup_steps=1",
                                "--set",    "train.log_every=1",
                                "--set",    "train.eval_every=1000000",
                                "--set",    "train.global_batch=12",
                                "--set",    "train.micro_batch=2",
                                "--set",    "train.out_dir=" + out.string()};
  if (!ckpt.empty())
    for (const std::string& x :
         {"checkpoint.dir=" + ckpt.string(), std::string("checkpoint.every=10"),
          std::string("checkpoint.async=false")}) {
      a.push_back("--set");
      a.push_back(x);
    }
  return a;
}

// The fixed run every elastic run must equal: one process, no checkpoints (about 2 s), run
// once per test process (ctest starts one per test) and removed when it ends.
class Reference : public ::testing::Environment {
 public:
  static const fs::path& metrics() {
    static const fs::path path = [] {
      const fs::path out = dir() / "one";
      std::string cmd = std::string(WEFT_BINARY) + " train";
      for (const std::string& a : train_args(out, "")) cmd += " '" + a + "'";
      CommandResult r = run_command("OMP_NUM_THREADS=1 " + cmd);
      if (r.code != 0) ADD_FAILURE() << "the single-process reference run failed:\n" << r.out;
      return out / "metrics.jsonl";
    }();
    return path;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir(), ec);
  }

 private:
  static fs::path dir() {
    return fs::temp_directory_path() / ("weft_netns_elastic_ref_" + std::to_string(::getpid()));
  }
};
[[maybe_unused]] ::testing::Environment* const kReference =
    ::testing::AddGlobalTestEnvironment(new Reference);

// The newest step folder under checkpoint.dir (retention keeps a few), -1 when none.
int64_t latest_checkpoint(const fs::path& ckpt) {
  int64_t best = -1;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(ckpt, ec)) {
    const std::string n = e.path().filename().string();
    long long s = -1;
    char tail;
    if (std::sscanf(n.c_str(), "step-%lld%c", &s, &tail) == 1) best = std::max<int64_t>(best, s);
  }
  return best;
}

// One job's agents, one per host at a time, each with a log of its own.
struct ElasticJob {
  struct Agent {
    int host = -1;
    pid_t pid = -1;
    fs::path log;
  };
  VirtualHosts& hosts;
  fs::path dir;
  std::string id;
  std::vector<Agent> agents;  // in start order
  std::string conf = kConf;   // --rdzv-conf

  fs::path out() const { return dir / "out"; }
  fs::path ckpt() const { return dir / "ckpt"; }
  fs::path metrics() const { return out() / "metrics.jsonl"; }

  // Starts an agent on `host` and returns its index in `agents`.
  int start(int host) {
    Agent a;
    a.host = host;
    a.log =
        dir / ("agent" + std::to_string(agents.size()) + "_host" + std::to_string(host) + ".log");
    std::vector<std::string> argv = {WEFT_BINARY,
                                     "run",
                                     "--nnodes",
                                     "2:3",
                                     "--nproc-per-node",
                                     "1",
                                     "--max-restarts",
                                     std::to_string(kMaxRestarts),
                                     "--rdzv-backend",
                                     "c10d",
                                     "--rdzv-id",
                                     id,
                                     "--rdzv-endpoint",
                                     hosts.hostname(0) + ":" + std::to_string(kPort),
                                     "--rdzv-conf",
                                     conf,
                                     "--",
                                     WEFT_BINARY,
                                     "train"};
    for (const std::string& x : train_args(out(), ckpt())) argv.push_back(x);
    argv.insert(argv.end(), {"--set", "elastic.on_change=restart"});  // the path under test
    a.pid =
        hosts.start(host, argv, a.log.string(), {"OMP_NUM_THREADS=1", "WEFT_JOB_TOKEN=" + kToken});
    agents.push_back(a);
    return int(agents.size()) - 1;
  }
  std::string text(int k) const { return slurp(agents.at(size_t(k)).log); }
  // Every agent's log for failure messages, without rank 0's progress and checkpoint lines.
  std::string all_logs() const {
    std::string s;
    for (size_t k = 0; k < agents.size(); ++k) {
      s += "--- agent " + std::to_string(k) + " on host" + std::to_string(agents[k].host) + " (" +
           node(int(k)) + ")\n";
      std::istringstream in(text(int(k)));
      for (std::string line; std::getline(in, line);)
        if (line.find("] step ") == std::string::npos &&
            line.find("] checkpoint: step ") == std::string::npos)
          s += line + "\n";
    }
    return s;
  }
  // Agent k's node id as the agents name it: "<hostname>-<agent pid>".
  std::string node(int k) const {
    const Agent& a = agents.at(size_t(k));
    return hosts.hostname(a.host) + "-" + std::to_string(a.pid);
  }
  bool ended(int k) { return hosts.ended(agents.at(size_t(k)).pid); }
  // Agent k's exit code, nullopt when it is still running after `limit` seconds.
  std::optional<int> wait(int k, double limit = kPatience) {
    if (!poll_until([&] { return ended(k); }, limit)) return std::nullopt;
    return hosts.wait(agents.at(size_t(k)).pid);
  }
  // Whether agent k's log holds `s` within `limit` seconds (false at once when it ended
  // without it).
  bool wait_for(int k, const std::string& s, double limit = kPatience) {
    bool found = false;
    poll_until(
        [&] {
          const bool over = ended(k);
          found = text(k).find(s) != std::string::npos;
          return found || over;
        },
        limit);
    return found;
  }
  // Whether a checkpoint of step >= `step` was saved within the time limit.
  bool wait_checkpoint(int64_t step) {
    return poll_until([&] { return latest_checkpoint(ckpt()) >= step; });
  }
  // The nodes waiting in the record before epoch 1 (read from host 0, which holds the store).
  std::vector<std::string> spares() {
    std::vector<std::string> out;
    hosts.in_host(0, [&] {
      comm::TCPStore store(comm::TCPStoreOptions{hosts.address(0), uint16_t(kPort),
                                                 std::chrono::milliseconds(10'000), kToken});
      const std::string key = "rdzv/" + id + "/state";
      if (store.check({key})) out = comm::decode(comm::to_string(store.get(key)), key).spares;
    });
    return out;
  }
  // Starts agents on hosts 0 .. n-1 so that host i gets node rank i (ranks follow the order
  // of arrival): each waits in the record before the next one starts.
  void start_in_order(int n) {
    for (int i = 0; i < n; ++i) {
      const int k = start(i);
      if (i == 0) {
        ASSERT_TRUE(wait_for(k, "serves the rendezvous store")) << all_logs();
      }
      if (i + 1 < n) {
        ASSERT_TRUE(poll_until([&] { return int(spares().size()) == i + 1; }, 30)) << all_logs();
      }
    }
  }
  // Seconds from `t0` until one of `watchers` logs `s`; -1 when none did in time.
  double detect(const std::vector<int>& watchers, const std::string& s, Clock::time_point t0) {
    double at = -1;
    poll_until([&] {
      for (int k : watchers)
        if (text(k).find(s) != std::string::npos) return at = seconds_since(t0), true;
      return false;
    });
    return at;
  }
};

// "(3,1)(2,2)" (appended piecewise: GCC 12 warns falsely of "(" + std::string).
std::string pairs(const std::vector<WorldEpoch>& v) {
  std::string s;
  for (const WorldEpoch& we : v) {
    s += '(';
    s += std::to_string(we.first);
    s += ',';
    s += std::to_string(we.second);
    s += ')';
  }
  return s;
}

// The metrics of the job: the fixed run's losses within kRel, one line per step in order,
// and the (world, epoch) of the attempts that wrote them, in order (repeats collapsed).
void expect_fixed_run(const fs::path& metrics, const std::vector<WorldEpoch>& attempts,
                      const std::string& logs) {
  ASSERT_TRUE(fs::exists(Reference::metrics())) << "no reference run";
  ASSERT_TRUE(fs::exists(metrics)) << logs;
  std::vector<WorldEpoch> seen;
  double worst = 0;
  std::vector<double> ref = metrics_losses(Reference::metrics());
  int64_t step = 0;
  for (const core::io::MetricsRow& row : core::io::read_metrics(metrics.string())) {
    if (row.is_validation()) continue;
    ASSERT_EQ(int64_t(row.at("step")), step) << "a line missing, repeated or out of order\n"
                                             << logs;
    if (size_t(step) < ref.size())
      worst = std::max(
          worst, std::fabs(row.at("loss") - ref[size_t(step)]) / std::fabs(ref[size_t(step)]));
    ++step;
    WorldEpoch we{int(row.at("world")), int(row.at("epoch"))};
    if (seen.empty() || seen.back() != we) seen.push_back(we);
  }
  std::printf("[ measured ] largest relative loss difference from one process: %.3g\n", worst);
  expect_same_losses(Reference::metrics(), metrics, kSteps, /*validation=*/false, kRel);
  EXPECT_EQ(pairs(seen), pairs(attempts)) << "(world, epoch) of the metrics lines\n" << logs;
}

// The line of `log` that holds `s`; "" when none.
std::string line_with(const std::string& log, const std::string& s) {
  size_t at = log.find(s);
  if (at == std::string::npos) return "";
  size_t from = log.rfind('\n', at);
  from = from == std::string::npos ? 0 : from + 1;
  return log.substr(from, log.find('\n', at) - from);
}

// Host 2 dies at once, its agent and worker with it (SIGKILL): the others see its heartbeat
// expire, restart as a world of two from the latest checkpoint and finish the fixed run.
TEST(NetnsElastic, KilledNodeLeavesTwoThatFinishTheRun) {
  SKIP_WITHOUT_HOSTS();
  const auto t_test = Clock::now();
  fs::path d = temp_dir("killed");
  VirtualHosts hosts(3);
  ElasticJob job{hosts, d, "killed"};
  ASSERT_NO_FATAL_FAILURE(job.start_in_order(3));
  ASSERT_TRUE(job.wait_for(2, "is node 2 of 3")) << job.all_logs();
  ASSERT_TRUE(job.wait_checkpoint(100)) << job.all_logs();
  const std::string lost = job.node(2);
  const auto t0 = Clock::now();
  EXPECT_GE(hosts.signal_host(2, SIGKILL), 2);
  const double detected = job.detect({0, 1}, "(lost " + lost + ")", t0);
  std::printf("[ measured ] killed node seen lost after %.2f s (heartbeat_timeout 2 s)\n",
              detected);
  std::optional<int> c0 = job.wait(0), c1 = job.wait(1), c2 = job.wait(2);
  std::printf("[ measured ] test took %.1f s\n", seconds_since(t_test));
  const std::string logs = job.all_logs();
  ASSERT_EQ(c0, 0) << logs;
  ASSERT_EQ(c1, 0) << logs;
  EXPECT_EQ(c2, 128 + SIGKILL) << logs;
  for (int k = 0; k < 2; ++k) {
    EXPECT_NE(job.text(k).find("weft run: membership changed: epoch 1 -> 2, 3 -> 2 nodes (lost " +
                               lost + "); restarting the workers (1 of --max-restarts 3 used)"),
              std::string::npos)
        << logs;
    EXPECT_NE(job.text(k).find("is node " + std::to_string(k) + " of 2 (epoch 2)"),
              std::string::npos)
        << logs;
  }
  expect_fixed_run(job.metrics(), {{3, 1}, {2, 2}}, logs);
  fs::remove_all(d);
}

// Host 2 freezes (SIGSTOP of its agent and worker) and loses its cable: the others learn it
// only from its heartbeat, go on as two and finish. Woken and plugged back while they still
// train, host 2 finds itself removed from the membership and stops, never joining back.
TEST(NetnsElastic, FrozenNodeIsRemovedAndStopsItselfWhenWoken) {
  SKIP_WITHOUT_HOSTS();
  const auto t_test = Clock::now();
  fs::path d = temp_dir("frozen");
  VirtualHosts hosts(3);
  ElasticJob job{hosts, d, "frozen"};
  ASSERT_NO_FATAL_FAILURE(job.start_in_order(3));
  ASSERT_TRUE(job.wait_for(2, "is node 2 of 3")) << job.all_logs();
  ASSERT_TRUE(job.wait_checkpoint(100)) << job.all_logs();
  const std::string lost = job.node(2);
  const auto t0 = Clock::now();
  EXPECT_GE(hosts.signal_host(2, SIGSTOP), 2);
  hosts.link_down(2);
  const double detected = job.detect({0, 1}, "(lost " + lost + ")", t0);
  std::printf("[ measured ] frozen node seen lost after %.2f s (heartbeat_timeout 2 s)\n",
              detected);
  // The two train on as a world of two; then host 2 comes back while they still do.
  for (int k = 0; k < 2; ++k)
    ASSERT_TRUE(job.wait_for(k, "is node " + std::to_string(k) + " of 2 (epoch 2)"))
        << job.all_logs();
  const int64_t resumed = latest_checkpoint(job.ckpt());
  ASSERT_TRUE(job.wait_checkpoint(resumed + 50)) << job.all_logs();
  ASSERT_FALSE(job.ended(2)) << "a stopped agent cannot have ended\n" << job.all_logs();
  hosts.link_up(2);
  const auto t1 = Clock::now();
  hosts.signal_host(2, SIGCONT);
  const double decided = job.detect({2}, "; stopping the workers", t1);
  const bool both_running = !job.ended(0) && !job.ended(1);
  std::optional<int> c2 = job.wait(2);
  std::printf(
      "[ measured ] the woken node stopped its workers %.2f s after SIGCONT (the two %s) and "
      "exited after %.2f s\n",
      decided, both_running ? "still training" : "had finished", seconds_since(t1));
  std::optional<int> c0 = job.wait(0), c1 = job.wait(1);
  std::printf("[ measured ] test took %.1f s\n", seconds_since(t_test));
  const std::string logs = job.all_logs();
  ASSERT_EQ(c0, 0) << logs;
  ASSERT_EQ(c1, 0) << logs;
  ASSERT_TRUE(c2.has_value()) << logs;
  EXPECT_NE(*c2, 0) << logs;
  const std::string l2 = job.text(2);
  std::printf("[ says     ] %s\n", line_with(l2, "weft run: failed: ").c_str());
  EXPECT_NE(l2.find("weft run: failed: node " + lost + " was removed from the membership"),
            std::string::npos)
      << logs;
  EXPECT_EQ(l2.find("(epoch 2)"), std::string::npos) << "rejoined\n" << logs;
  EXPECT_EQ(l2.find("(epoch 3)"), std::string::npos) << "rejoined\n" << logs;
  // Nor did it disturb the two: no restart round asked for, no new epoch.
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(job.text(k).find("restart round"), std::string::npos) << logs;
    EXPECT_EQ(job.text(k).find("epoch 2 -> 3"), std::string::npos) << logs;
  }
  expect_fixed_run(job.metrics(), {{3, 1}, {2, 2}}, logs);
  fs::remove_all(d);
}

// Two hosts train; a third starts later: the two admit it at once (it fills --nnodes' MAX),
// all three restart as a world of three, and the restart is not a failure.
TEST(NetnsElastic, JoiningNodeGrowsTheWorldWithoutUsingARestart) {
  SKIP_WITHOUT_HOSTS();
  const auto t_test = Clock::now();
  fs::path d = temp_dir("join");
  VirtualHosts hosts(3);
  ElasticJob job{hosts, d, "join"};
  job.conf = kQuickLastCall;  // the two start alone; the third fills MAX and is admitted at once
  ASSERT_NO_FATAL_FAILURE(job.start_in_order(2));
  ASSERT_TRUE(job.wait_for(1, "is node 1 of 2 (rendezvous")) << job.all_logs();
  ASSERT_TRUE(job.wait_checkpoint(100)) << job.all_logs();
  const auto t0 = Clock::now();
  const int k2 = job.start(2);
  const std::string joined = job.node(k2);
  const double admitted = job.detect({0, 1}, "(joined " + joined + ")", t0);
  std::printf("[ measured ] joining node admitted after %.2f s\n", admitted);
  std::optional<int> c0 = job.wait(0), c1 = job.wait(1), c2 = job.wait(k2);
  std::printf("[ measured ] test took %.1f s\n", seconds_since(t_test));
  const std::string logs = job.all_logs();
  ASSERT_EQ(c0, 0) << logs;
  ASSERT_EQ(c1, 0) << logs;
  ASSERT_EQ(c2, 0) << logs;
  for (int k = 0; k < 2; ++k) {
    EXPECT_NE(job.text(k).find("weft run: membership changed: epoch 1 -> 2, 2 -> 3 nodes (joined " +
                               joined + "); restarting the workers (0 of --max-restarts 3 used)"),
              std::string::npos)
        << logs;
    // A join leaves the world whole: the workers end their step (SIGTERM), not killed.
    EXPECT_NE(job.text(k).find("(joined " + joined + "); stopping the workers\n"),
              std::string::npos)
        << logs;
  }
  EXPECT_NE(job.text(k2).find("is node 2 of 3 (rendezvous"), std::string::npos) << logs;
  expect_fixed_run(job.metrics(), {{2, 1}, {3, 2}}, logs);
  fs::remove_all(d);
}

// 3 -> 2 -> 3: host 2 is killed, the two go on, then a fresh agent on host 2 joins and the
// three finish. The losses are the fixed run's step for step.
TEST(NetnsElastic, ThreeTwoThreeGivesTheFixedRun) {
  SKIP_WITHOUT_HOSTS();
  const auto t_test = Clock::now();
  fs::path d = temp_dir("323");
  VirtualHosts hosts(3);
  ElasticJob job{hosts, d, "three-two-three"};
  ASSERT_NO_FATAL_FAILURE(job.start_in_order(3));
  ASSERT_TRUE(job.wait_for(2, "is node 2 of 3")) << job.all_logs();
  ASSERT_TRUE(job.wait_checkpoint(100)) << job.all_logs();
  const std::string lost = job.node(2);
  const auto t0 = Clock::now();
  EXPECT_GE(hosts.signal_host(2, SIGKILL), 2);
  const double detected = job.detect({0, 1}, "(lost " + lost + ")", t0);
  std::printf("[ measured ] killed node seen lost after %.2f s\n", detected);
  EXPECT_EQ(job.wait(2), 128 + SIGKILL);
  for (int k = 0; k < 2; ++k)
    ASSERT_TRUE(job.wait_for(k, "is node " + std::to_string(k) + " of 2 (epoch 2)"))
        << job.all_logs();
  ASSERT_TRUE(job.wait_checkpoint(latest_checkpoint(job.ckpt()) + 50)) << job.all_logs();
  const auto t1 = Clock::now();
  const int k3 = job.start(2);
  const std::string joined = job.node(k3);
  const double admitted = job.detect({0, 1}, "(joined " + joined + ")", t1);
  std::printf("[ measured ] fresh node on host 2 admitted after %.2f s\n", admitted);
  std::optional<int> c0 = job.wait(0), c1 = job.wait(1), c3 = job.wait(k3);
  std::printf("[ measured ] test took %.1f s\n", seconds_since(t_test));
  const std::string logs = job.all_logs();
  ASSERT_EQ(c0, 0) << logs;
  ASSERT_EQ(c1, 0) << logs;
  ASSERT_EQ(c3, 0) << logs;
  for (int k = 0; k < 2; ++k)
    EXPECT_NE(job.text(k).find("weft run: membership changed: epoch 2 -> 3, 2 -> 3 nodes (joined " +
                               joined + "); restarting the workers (1 of --max-restarts 3 used)"),
              std::string::npos)
        << logs;
  EXPECT_NE(job.text(k3).find("is node 2 of 3 (rendezvous"), std::string::npos) << logs;
  expect_fixed_run(job.metrics(), {{3, 1}, {2, 2}, {3, 3}}, logs);
  fs::remove_all(d);
}

// A 2|1 partition: host 2 keeps running but reaches neither the others nor the store. The
// majority re-forms without it and finishes; host 2 stops itself, saying it lost quorum or
// was removed, and never trains on alone.
TEST(NetnsElastic, MinorityOfAPartitionStopsItself) {
  SKIP_WITHOUT_HOSTS();
  const auto t_test = Clock::now();
  fs::path d = temp_dir("partition");
  VirtualHosts hosts(3);
  ElasticJob job{hosts, d, "partition"};
  ASSERT_NO_FATAL_FAILURE(job.start_in_order(3));
  ASSERT_TRUE(job.wait_for(2, "is node 2 of 3")) << job.all_logs();
  ASSERT_TRUE(job.wait_checkpoint(100)) << job.all_logs();
  const std::string cut = job.node(2);
  const auto t0 = Clock::now();
  hosts.partition({2});
  const double detected = job.detect({0, 1}, "(lost " + cut + ")", t0);
  std::printf("[ measured ] majority saw the cut-off node lost after %.2f s\n", detected);
  const double fenced = job.detect({2}, "; stopping the workers", t0);
  std::optional<int> c2 = job.wait(2);
  std::printf(
      "[ measured ] the minority stopped its workers %.2f s after the partition and exited "
      "after %.2f s\n",
      fenced, seconds_since(t0));
  hosts.heal();
  std::optional<int> c0 = job.wait(0), c1 = job.wait(1);
  std::printf("[ measured ] test took %.1f s\n", seconds_since(t_test));
  const std::string logs = job.all_logs();
  ASSERT_EQ(c0, 0) << logs;
  ASSERT_EQ(c1, 0) << logs;
  ASSERT_TRUE(c2.has_value()) << "the minority is still running\n" << logs;
  EXPECT_NE(*c2, 0) << logs;
  const std::string l2 = job.text(2);
  const std::string failed = line_with(l2, "weft run: failed: ");
  std::printf("[ says     ] %s\n", failed.c_str());
  EXPECT_TRUE(failed.find("lost quorum") != std::string::npos ||
              failed.find("removed from the membership") != std::string::npos)
      << failed << "\n"
      << logs;
  EXPECT_EQ(l2.find("(epoch 2)"), std::string::npos) << "rejoined\n" << logs;
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(job.text(k).find("restart round"), std::string::npos) << logs;
    EXPECT_EQ(job.text(k).find("epoch 2 -> 3"), std::string::npos) << logs;
  }
  expect_fixed_run(job.metrics(), {{3, 1}, {2, 2}}, logs);
  fs::remove_all(d);
}

}  // namespace
}  // namespace weft::test
