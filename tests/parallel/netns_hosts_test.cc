// `weft run` on hosts that are network namespaces (tests/support/netns.h): one agent per host,
// each on its own network stack, finding the store host by name over a virtual switch as on a
// cluster. A host frozen and unplugged, a host killed, a stranger without the token.
// No timing thresholds: detection times are printed; every wait is bounded by ctest.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "comm/store/tcp_store.h"
#include "core/io/metrics.h"
#include "tests/comm/store_raw_client.h"
#include "tests/support/metrics_compare.h"
#include "tests/support/agent_tests.h"
#include "tests/support/netns.h"
#include "tests/support/run_weft.h"

namespace weft::test {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
const std::string kConfig = std::string(WEFT_SOURCE_DIR) + "/configs/gpt-layout.yaml";
const std::string kToken = "netns-hosts-test-token";
constexpr int kPort = 29400;  // every host has ports of its own: no free-port race
// A node silent for 2 s is lost (heartbeat_timeout); the timeout hierarchy wants last_call
// below join_timeout, which is 60 s so that a job that never forms fails well inside ctest's.
const std::vector<std::string> kFastConf = {
    "--rdzv-conf",
    "heartbeat_interval=0.5,heartbeat_timeout=2,last_call_timeout=1,join_timeout=60"};
// A worker that says it runs, then runs until it is stopped: the tests about lost nodes need
// no training.
const std::vector<std::string> kIdle = {"sh", "-c", "echo worker is up; exec sleep 600"};

#define SKIP_WITHOUT_HOSTS()                                                                \
  do {                                                                                      \
    std::string why;                                                                        \
    if (!VirtualHosts::available(&why)) GTEST_SKIP() << why;                                \
    ASSERT_EQ(::access(WEFT_BINARY, X_OK), 0) << WEFT_BINARY << " is built with the tests"; \
  } while (0)

fs::path temp_dir(const std::string& name) { return agent_test_dir("netns", name); }

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The agents of one test, one per host, each logging to <dir>/host<i>.log.
struct Job {
  VirtualHosts& hosts;
  fs::path dir;
  std::string id;
  std::vector<pid_t> agents = std::vector<pid_t>(size_t(hosts.size()), -1);

  fs::path log(int i) const { return dir / ("host" + std::to_string(i) + ".log"); }
  std::string text(int i) const { return slurp(log(i)); }
  std::string all_logs() const {
    std::string s;
    for (int i = 0; i < hosts.size(); ++i) s += "--- host" + std::to_string(i) + "\n" + text(i);
    return s;
  }
  // `weft run` for every node of the job on host i, the endpoint named by host 0's name.
  // By address instead when `by_address`.
  pid_t start(int i, const std::vector<std::string>& command, const std::string& token = kToken,
              bool by_address = false) {
    const std::string endpoint =
        (by_address ? hosts.address(0) : hosts.hostname(0)) + ":" + std::to_string(kPort);
    std::vector<std::string> a = {
        WEFT_BINARY,        "run", "--nnodes",        std::to_string(hosts.size()),
        "--nproc-per-node", "1",   "--rdzv-backend",  "c10d",
        "--rdzv-id",        id,    "--rdzv-endpoint", endpoint};
    a.insert(a.end(), kFastConf.begin(), kFastConf.end());
    a.push_back("--");
    a.insert(a.end(), command.begin(), command.end());
    agents[size_t(i)] =
        hosts.start(i, a, log(i).string(), {"OMP_NUM_THREADS=1", "WEFT_JOB_TOKEN=" + token});
    return agents[size_t(i)];
  }
  // Host i's node id as the agents name it: "<hostname>-<agent pid>".
  std::string node(int i) const {
    return hosts.hostname(i) + "-" + std::to_string(agents[size_t(i)]);
  }
  // Host i's node rank, from its "is node K of N" line (the order of arrival, not i).
  std::string node_rank(int i) const {
    std::string t = text(i), key = "is node ";
    size_t at = t.find(key);
    if (at == std::string::npos) return "?";
    at += key.size();
    return t.substr(at, t.find(' ', at) - at);
  }
  // Polls host i's log until it holds `text`; false when the agent ended without it.
  bool wait_for(int i, const std::string& s) {
    for (;;) {
      if (text(i).find(s) != std::string::npos) return true;
      if (hosts.ended(agents[size_t(i)])) return text(i).find(s) != std::string::npos;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
};

std::vector<std::string> train(const fs::path& out, int steps, int dp) {
  return {WEFT_BINARY, "train",
          "--config",  kConfig,
          "--set",     "train.steps=" + std::to_string(steps),
          "--set",     "train.warmup_steps=1",
          "--set",     "train.log_every=1",
          "--set",     "train.eval_every=1000000",
          "--set",     "train.global_batch=12",
          "--set",     "train.micro_batch=2",
          "--set",     "parallel.dp=" + std::to_string(dp),
          "--set",     "train.out_dir=" + out.string()};
}

// Not gone and not a zombie (a dead process that its parent, maybe init, has yet to reap).
bool alive(pid_t pid) {
  std::string stat = slurp("/proc/" + std::to_string(pid) + "/stat");
  size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

// A TCP connection from the calling thread's namespace to addr:port within `ms`.
bool connects(const std::string& addr, int port, int ms) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  ::inet_pton(AF_INET, addr.c_str(), &a.sin_addr);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  if (!ok && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    int err = -1;
    socklen_t n = sizeof err;
    ok =
        ::poll(&p, 1, ms) == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &n) == 0 && err == 0;
  }
  ::close(fd);
  return ok;
}

// The harness itself: names resolve inside a host, cables and the partition cut what they
// should, and nothing is left once the hosts are gone.
TEST(VirtualHostsTest, HostsReachEachOtherOnlyOverTheirCables) {
  SKIP_WITHOUT_HOSTS();
  fs::path d = temp_dir("harness");
  std::vector<pid_t> started;
  const std::string mine = "weft-vh-" + std::to_string(::getpid()) + "-";
  const std::string kMachineNetwork = "ip -br link; ip -br addr; ip route";
  const std::string machine = run_command(kMachineNetwork).out;
  {
    VirtualHosts hosts(3);
    ASSERT_EQ(hosts.size(), 3);
    EXPECT_EQ(run_command(kMachineNetwork).out, machine) << "the machine's own network changed";
    pid_t p = hosts.start(1, {"sh", "-c", "hostname; getent hosts host0 host2"},
                          (d / "names.log").string());
    ASSERT_EQ(hosts.wait(p), 0) << slurp(d / "names.log");
    std::string names = slurp(d / "names.log");
    EXPECT_EQ(names.rfind("host1\n", 0), 0u) << names;
    EXPECT_NE(names.find(hosts.address(0) + " "), std::string::npos) << names;
    EXPECT_NE(names.find(hosts.address(2) + " "), std::string::npos) << names;

    // A listener on every host; who reaches whom.
    std::vector<int> listeners;
    for (int i = 0; i < 3; ++i)
      hosts.in_host(i, [&] {
        int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(kPort);
        a.sin_addr.s_addr = htonl(INADDR_ANY);
        ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << "host " << i;
        ASSERT_EQ(::listen(fd, 16), 0);
        listeners.push_back(fd);
      });
    // A connection that should work may take its time (the guard is 10 s); one that should
    // not gets half a second to show that it does not.
    auto reach = [&](int from, int to, int ms = 10'000) {
      bool ok = false;
      hosts.in_host(from, [&] { ok = connects(hosts.address(to), kPort, ms); });
      return ok;
    };
    auto cut = [&](int from, int to) { return !reach(from, to, 500); };
    EXPECT_TRUE(reach(0, 1));
    EXPECT_TRUE(reach(2, 0));
    hosts.link_down(1);
    EXPECT_TRUE(cut(0, 1));
    EXPECT_TRUE(reach(0, 2));
    hosts.link_up(1);
    EXPECT_TRUE(reach(0, 1));
    hosts.partition({1, 2});
    EXPECT_TRUE(reach(1, 2));
    EXPECT_TRUE(cut(0, 1));
    EXPECT_TRUE(cut(2, 0));
    hosts.heal();
    EXPECT_TRUE(reach(2, 0));
    for (int fd : listeners) ::close(fd);

    // Processes that outlive the test: a group leader and a child in a group of its own.
    pid_t q =
        hosts.start(2, {"sh", "-c", "setsid sleep 600 & exec sleep 600"}, (d / "q.log").string());
    while (hosts.pids(2).size() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    started = hosts.pids(2);
    EXPECT_NE(std::find(started.begin(), started.end(), q), started.end());
    EXPECT_EQ(hosts.signal_host(2, SIGSTOP), 2);
    std::string list = run_command("ip netns list").out;
    EXPECT_NE(list.find(mine), std::string::npos) << list;
  }
  std::string list = run_command("ip netns list").out;
  EXPECT_EQ(list.find(mine), std::string::npos) << list;
  for (pid_t p : started)  // q was reaped by the hosts; the orphan is dead (init reaps it)
    EXPECT_FALSE(alive(p)) << "process " << p << " outlived its host";
  for (const auto& e : fs::directory_iterator(fs::temp_directory_path()))
    EXPECT_NE(e.path().filename().string().rfind(mine, 0), 0u) << e.path() << " was left";
  fs::remove_all(d);
}

// Three machines train one data-parallel job; the losses equal one process's. (Each worker's
// Gloo listens on its address toward the store, which the others reach; 127.0.0.1 would send
// them to their own loopback.)
TEST(NetnsHosts, ThreeHostsTrainLikeOneProcess) {
  SKIP_WITHOUT_HOSTS();
  fs::path d = temp_dir("train");
  CommandResult one = run_command(
      std::string(WEFT_BINARY) + " train --config " + kConfig +
      " --set train.steps=4 --set train.warmup_steps=1 --set train.log_every=1 --set "
      "train.eval_every=1000000 --set train.global_batch=12 --set train.micro_batch=2 --set "
      "train.out_dir=" +
      (d / "one").string());
  ASSERT_EQ(one.code, 0) << one.out;
  VirtualHosts hosts(3);
  Job job{hosts, d, "train"};
  // Each host has its own out_dir (on real machines they would not share one); global rank 0,
  // on whichever host arrived first, writes the metrics.
  for (int i = 0; i < 3; ++i) job.start(i, train(d / ("out" + std::to_string(i)), 4, 3));
  std::vector<int> codes;
  for (int i = 0; i < 3; ++i) codes.push_back(hosts.wait(job.agents[size_t(i)]));
  for (int i = 0; i < 3; ++i) ASSERT_EQ(codes[size_t(i)], 0) << job.all_logs();
  std::string logs = job.all_logs();
  EXPECT_NE(logs.find("serves the rendezvous store"), std::string::npos) << logs;
  for (int n = 0; n < 3; ++n)
    EXPECT_NE(logs.find("is node " + std::to_string(n) + " of 3"), std::string::npos) << logs;
  fs::path metrics;
  for (int i = 0; i < 3; ++i) {
    fs::path m = d / ("out" + std::to_string(i)) / "metrics.jsonl";
    if (fs::exists(m) && fs::file_size(m) > 0) metrics = m;
  }
  ASSERT_FALSE(metrics.empty()) << logs;
  expect_same_losses(d / "one" / "metrics.jsonl", metrics, 4, /*validation=*/false, 1e-7);
  EXPECT_EQ(core::io::read_metrics(metrics.string()).at(0).at("world"), 3);
  fs::remove_all(d);
}

// The endpoint given as host 0's address, as launch scripts often do (MASTER_ADDR=10.0.0.1):
// the agent on that host serves the store, bound to that address only.
TEST(NetnsHosts, AddressEndpointIsServedByItsHost) {
  SKIP_WITHOUT_HOSTS();
  fs::path d = temp_dir("address");
  VirtualHosts hosts(2);
  Job job{hosts, d, "address"};
  for (int i = 0; i < 2; ++i) job.start(i, {"true"}, kToken, /*by_address=*/true);
  int c0 = hosts.wait(job.agents[0]), c1 = hosts.wait(job.agents[1]);
  std::string logs = job.all_logs();
  EXPECT_EQ(c0, 0) << logs;
  EXPECT_EQ(c1, 0) << logs;
  EXPECT_NE(job.text(0).find("serves the rendezvous store on " + hosts.address(0) + ":" +
                            std::to_string(kPort)),
            std::string::npos)
      << logs;
  EXPECT_EQ(job.text(1).find("serves the rendezvous store"), std::string::npos) << logs;
  fs::remove_all(d);
}

// Host 2 freezes (SIGSTOP of its agent and workers) and loses its cable: nothing tells the
// others, whose only clue is its heartbeat expiring. They stop the job naming the node; when
// host 2 wakes up later it finds the job gone and stops too.
TEST(NetnsHosts, FrozenUnpluggedHostIsNamedAsLost) {
  SKIP_WITHOUT_HOSTS();
  fs::path d = temp_dir("frozen");
  VirtualHosts hosts(3);
  Job job{hosts, d, "frozen"};
  for (int i = 0; i < 3; ++i) job.start(i, kIdle);
  // Every node's worker is up (a stopped agent must not be half-way through starting one).
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(job.wait_for(i, "worker is up")) << job.all_logs();
  const std::string lost = job.node(2);
  const auto t0 = Clock::now();
  // The agent, its worker (and today the agent's guardian process).
  EXPECT_GE(hosts.signal_host(2, SIGSTOP), 2);
  hosts.link_down(2);
  // The first survivor's log to name the node.
  double detected = -1;
  while (detected < 0 && !(hosts.ended(job.agents[0]) && hosts.ended(job.agents[1]))) {
    if ((job.text(0) + job.text(1)).find("lost node " + lost) != std::string::npos)
      detected = seconds_since(t0);
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  int c0 = hosts.wait(job.agents[0]), c1 = hosts.wait(job.agents[1]);
  const double stopped = seconds_since(t0);
  std::printf(
      "[ measured ] frozen host named lost after %.2f s, both others exited after %.2f s "
      "(heartbeat_interval 0.5 s, heartbeat_timeout 2 s)\n",
      detected, stopped);
  std::string logs = job.all_logs();
  EXPECT_EQ(c0, 1) << logs;
  EXPECT_EQ(c1, 1) << logs;
  // One survivor finds the expired heartbeat and closes the job; the other may find either.
  const std::string named =
      "lost node " + lost + " (node rank " + job.node_rank(2) + "): its heartbeat expired";
  EXPECT_NE((job.text(0) + job.text(1)).find("weft run: failed: " + named), std::string::npos)
      << logs;
  for (int i = 0; i < 2; ++i)
    EXPECT_NE(job.text(i).find(named), std::string::npos) << "host" << i << "\n" << logs;
  ASSERT_FALSE(hosts.ended(job.agents[2])) << "a stopped agent cannot have ended";

  // Host 2 comes back after the job ended without it: it must not run on alone.
  hosts.link_up(2);
  const auto t1 = Clock::now();
  hosts.signal_host(2, SIGCONT);
  int c2 = hosts.wait(job.agents[2]);
  std::printf("[ measured ] the woken host stopped %.2f s after SIGCONT\n", seconds_since(t1));
  const std::string l2 = job.text(2);
  EXPECT_EQ(c2, 1) << l2;
  EXPECT_TRUE(l2.find("weft run: failed: lost the rendezvous store") != std::string::npos ||
              l2.find("weft run: failed: the job was stopped by another node: " + named) !=
                  std::string::npos)
      << l2;
  fs::remove_all(d);
}

// An agent on another host with the wrong token is refused at once; a raw client there
// without the token reads nothing, while one with the token reads the job's state over the
// same path (so the refusal is the store's, not the network's).
TEST(NetnsHosts, WrongTokenFromAnotherHostFailsAtOnceAndReadsNothing) {
  SKIP_WITHOUT_HOSTS();
  fs::path d = temp_dir("token");
  VirtualHosts hosts(3);
  Job job{hosts, d, "token"};
  job.start(0, kIdle);
  ASSERT_TRUE(job.wait_for(0, "serves the rendezvous store on 0.0.0.0:" + std::to_string(kPort)))
      << job.all_logs();
  const auto t0 = Clock::now();
  job.start(1, kIdle, "not-the-token");
  int c1 = hosts.wait(job.agents[1]);
  std::printf("[ measured ] wrong token refused after %.2f s\n", seconds_since(t0));
  std::string l1 = job.text(1);
  EXPECT_NE(c1, 0) << l1;
  EXPECT_NE(l1.find("WEFT_JOB_TOKEN"), std::string::npos) << l1;
  EXPECT_EQ(l1.find("is node"), std::string::npos) << l1;

  const std::string state = "rdzv/token/state";
  hosts.in_host(2, [&] {
    comm::TCPStore good(comm::TCPStoreOptions{hosts.address(0), uint16_t(kPort),
                                              std::chrono::milliseconds(10'000), kToken});
    ASSERT_TRUE(good.check({state}));
    const comm::Bytes record = good.get(state);
    ASSERT_NE(comm::to_string(record).find(job.node(0)), std::string::npos);

    RawClient raw(hosts.address(0), uint16_t(kPort), RawClient::Handshake::kSkip);
    EXPECT_FALSE(raw.handshake(""));
    EXPECT_NE(raw.refusal().find("requires the job token"), std::string::npos) << raw.refusal();
    raw.send(request(9, comm::wire::Op::kGet).str(state).i64(1000).finish());
    raw.send(request(10, comm::wire::Op::kNumKeys).str("").finish());
    comm::Bytes got;
    EXPECT_TRUE(raw.closed_by_peer(&got)) << "the connection stayed open";
    EXPECT_EQ(comm::to_string(got).find(job.node(0)), std::string::npos);
  });
  EXPECT_FALSE(hosts.ended(job.agents[0])) << "the job's own agent is unaffected\n"
                                           << job.all_logs();
  fs::remove_all(d);
}

// The store lives in host 0's agent: when that host dies, the others lose the store at once
// and say whose it was.
TEST(NetnsHosts, KilledStoreHostIsNamed) {
  SKIP_WITHOUT_HOSTS();
  fs::path d = temp_dir("storehost");
  VirtualHosts hosts(3);
  Job job{hosts, d, "storehost"};
  for (int i = 0; i < 3; ++i) job.start(i, kIdle);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(job.wait_for(i, "worker is up")) << job.all_logs();
  const std::string host = job.node(0);
  const auto t0 = Clock::now();
  EXPECT_GE(hosts.signal_host(0, SIGKILL), 1);
  EXPECT_EQ(hosts.wait(job.agents[0]), 128 + SIGKILL);
  int c1 = hosts.wait(job.agents[1]), c2 = hosts.wait(job.agents[2]);
  std::printf("[ measured ] both others stopped %.2f s after the store host was killed\n",
              seconds_since(t0));
  std::string logs = job.all_logs();
  EXPECT_EQ(c1, 1) << logs;
  EXPECT_EQ(c2, 1) << logs;
  const std::string named = "weft run: failed: lost the rendezvous store at " + hosts.hostname(0) +
                            ":" + std::to_string(kPort) + " (hosted by node " + host;
  for (int i = 1; i < 3; ++i)
    EXPECT_NE(job.text(i).find(named), std::string::npos) << "host" << i << "\n" << logs;
  fs::remove_all(d);
}

}  // namespace
}  // namespace weft::test
