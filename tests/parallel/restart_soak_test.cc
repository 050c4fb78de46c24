// A soak of weft run's restarts: two agents on loopback (and a standalone one) restart their
// workers 20 times, and the agents' open descriptors, threads, child processes and resident
// memory do not grow from restart 5 to restart 20. Also: the 21st failure ends the job with
// "no restarts left". The workers are `sh` (no training): the agents are what is measured.
//
// Each attempt's worker prints "soak attempt <TORCHELASTIC_RESTART_COUNT>" and waits for
// the file sampled_<n>, which the test writes once it has read /proc of every agent: each
// sample is taken in the middle of an attempt (the workers running), never while an agent
// tears one down or starts the next, so equal means equal. No timing thresholds.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/support/run_weft.h"

namespace weft::test {
namespace {

namespace fs = std::filesystem;
constexpr int kRestarts = 20;
constexpr int kEarly = 5;  // compared with kRestarts: the first restarts settle caches, pools
// The agents' resident memory may move this much in each half of restarts 5 to 20 (5 -> 12
// and 13 -> 20), and a leak must show in both halves: a leak grows with every restart, while
// the allocator may keep a block once (glibc raises its mmap threshold when a large block is
// freed, and later blocks of that size stay on the heap). Measured here (Release, glibc
// malloc): +0 to +28 KiB from restart 5 to 20 in 5 runs (the store host keeps a few keys per
// round: rdzv/<id>/round_reason/<r>, .../round/<r>/exited/<node>); on 2026-12-04 the
// standalone agent stepped up 700-1000 KiB once, at restart 6, in 14 of 15 runs, at the
// commit CI had passed (d5376dc) as at later ones, then stayed flat to the kilobyte.
// 256 KiB over 7 restarts catches a leak of 37 KiB or more per restart; checked: 40 KiB
// malloc'd and touched per attempt in supervise() moved every agent by about 600 KiB over
// 15 restarts and failed this test.
constexpr long kRssSlackKib = 256;

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t n = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  ::close(fd);
  return ntohs(a.sin_port);
}

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("weft_soak_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// What one agent holds, from /proc.
struct Sample {
  int fds = 0, threads = 0, children = 0;  // children: zombies included
  long rss_kib = 0;
};

int entries(const fs::path& dir) {
  std::error_code ec;
  int n = 0;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) ++n;
  return n;
}

Sample sample(pid_t pid) {
  const fs::path proc = "/proc/" + std::to_string(pid);
  Sample s;
  s.fds = entries(proc / "fd");
  s.threads = entries(proc / "task");
  std::error_code ec;
  for (fs::directory_iterator it(proc / "task", ec), end; !ec && it != end; it.increment(ec)) {
    std::stringstream kids(slurp(it->path() / "children"));
    for (pid_t k; kids >> k;) ++s.children;
  }
  std::stringstream status(slurp(proc / "status"));
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmRSS:", 0) == 0) s.rss_kib = std::stol(line.substr(6));
  return s;
}

std::string show(const Sample& s) {
  return "fds " + std::to_string(s.fds) + ", threads " + std::to_string(s.threads) + ", children " +
         std::to_string(s.children) + ", VmRSS " + std::to_string(s.rss_kib) + " KiB";
}

// The worker of every attempt: says which attempt it is, waits until the test sampled the
// agents, then node `fail_rank`'s worker fails while the attempt is below `fail_until` (and
// succeeds after); the others run until stopped, or end with success in the last attempt.
std::vector<std::string> worker(const fs::path& d, int fail_rank, int fail_until) {
  const std::string rank = std::to_string(fail_rank), until = std::to_string(fail_until);
  std::string script = "n=$TORCHELASTIC_RESTART_COUNT; echo \"soak attempt $n\"; ";
  script += "while [ ! -e '" + d.string() + "/sampled_'$n ]; do sleep 0.02; done; ";
  script += "if [ \"$GROUP_RANK\" = " + rank + " ]; then [ $n -lt " + until + " ] && exit 1; ";
  script += "exit 0; fi; [ $n -lt " + until + " ] && exec sleep 600; exit 0";
  return {"sh", "-c", script};
}

struct Agent {
  pid_t pid = -1;
  fs::path log;
  int code = -1;
  std::vector<Sample> samples;  // by attempt
};

// Runs the agents to their end, sampling each at every attempt its worker reported (all
// agents in the same attempt: those still running), and returns their exit codes in `agents`.
// Agents left running when an assertion fails are killed and reaped.
void run_and_sample(std::vector<Agent>& agents, const fs::path& d) {
  struct Reaper {
    std::vector<Agent>& a;
    ~Reaper() {
      for (Agent& x : a)
        if (x.pid > 0 && x.code < 0) {
          ::kill(x.pid, SIGKILL);
          ::waitpid(x.pid, nullptr, 0);
        }
    }
  } reaper{agents};
  for (int attempt = 0;;) {
    bool all_done = true, all_there = true;
    for (Agent& a : agents) {
      int status = 0;
      if (a.code < 0 && ::waitpid(a.pid, &status, WNOHANG) == a.pid)
        a.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      all_done = all_done && a.code >= 0;
      all_there =
          all_there && (a.code >= 0 || slurp(a.log).find("soak attempt " + std::to_string(attempt) +
                                                         "\n") != std::string::npos);
    }
    if (all_done) return;
    if (all_there) {
      for (Agent& a : agents)
        if (a.code < 0) a.samples.push_back(sample(a.pid));
      std::ofstream(d / ("sampled_" + std::to_string(attempt)));
      ++attempt;
      continue;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::vector<std::string> agent_args(int port, const std::string& id, int max_restarts,
                                    const std::vector<std::string>& command) {
  std::vector<std::string> a = {"run", "--nnodes", "2", "--nproc-per-node", "1"};
  a.insert(a.end(), {"--max-restarts", std::to_string(max_restarts), "--rdzv-id", id});
  a.insert(a.end(), {"--rdzv-endpoint", "127.0.0.1:" + std::to_string(port), "--"});
  a.insert(a.end(), command.begin(), command.end());
  return a;
}

// Two agents whose node 1 fails its first `fail_until` attempts under --max-restarts 20.
std::vector<Agent> two_nodes(const fs::path& d, const std::string& id, int fail_until) {
  std::vector<Agent> agents(2);
  const int port = free_port();
  for (int i = 0; i < 2; ++i) {
    agents[size_t(i)].log = d / (std::string(1, char('a' + i)) + ".log");
    agents[size_t(i)].pid =
        start_weft(agent_args(port, id, kRestarts, worker(d, 1, fail_until)),
                   agents[size_t(i)].log.string(), {"WEFT_JOB_TOKEN=restart-soak-token"});
  }
  run_and_sample(agents, d);
  return agents;
}

// fds and threads equal, children equal (a reaped guardian and worker per attempt), from
// restart 5 to restart 20; RSS within kRssSlackKib in at least one half of that span.
void expect_no_growth(const Agent& a, const std::string& name) {
  ASSERT_EQ(a.samples.size(), size_t(kRestarts + 1)) << name << "\n" << slurp(a.log);
  std::string series;
  for (size_t k = 0; k < a.samples.size(); ++k)
    series += "  restart " + std::to_string(k) + ": " + show(a.samples[k]) + "\n";
  const Sample &early = a.samples[kEarly], &late = a.samples[kRestarts];
  std::printf("%s: after restart %d: %s\n%s: after restart %d: %s\n", name.c_str(), kEarly,
              show(early).c_str(), name.c_str(), kRestarts, show(late).c_str());
  EXPECT_EQ(late.fds, early.fds) << name << "\n" << series;
  EXPECT_EQ(late.threads, early.threads) << name << "\n" << series;
  EXPECT_EQ(late.children, early.children) << name << "\n" << series;
#if defined(__SANITIZE_ADDRESS__)
  // AddressSanitizer holds freed memory in its quarantine (up to 256 MiB), so RSS grows by
  // every attempt's frees; its LeakSanitizer checks the agents' leaks at exit instead.
  (void)kRssSlackKib;
#else
  const int mid = (kEarly + kRestarts) / 2;  // 12: 5 -> 12 and 13 -> 20
  const long first = a.samples[mid].rss_kib - early.rss_kib;
  const long second = late.rss_kib - a.samples[mid + 1].rss_kib;
  EXPECT_TRUE(first <= kRssSlackKib || second <= kRssSlackKib)
      << name << ": RSS grew " << first << " KiB over restarts " << kEarly << "-" << mid
      << " and " << second << " KiB over " << mid + 1 << "-" << kRestarts << "\n"
      << series;
#endif
}

TEST(RestartSoak, TwoAgentsRestartTwentyTimesWithoutGrowing) {
  fs::path d = temp_dir("nodes");
  std::vector<Agent> agents = two_nodes(d, "soak", kRestarts);
  for (size_t i = 0; i < agents.size(); ++i) {
    const std::string log = slurp(agents[i].log);
    ASSERT_EQ(agents[i].code, 0) << log;
    EXPECT_EQ(count(log, "restarting the workers"), size_t(kRestarts)) << log;
    EXPECT_NE(log.find("(20 of --max-restarts 20 used)"), std::string::npos) << log;
    const bool host = log.find("serves the rendezvous store") != std::string::npos;
    expect_no_growth(agents[i], std::string(host ? "store host" : "other node") + " agent");
  }
  fs::remove_all(d);
}

TEST(RestartSoak, TwentyFirstFailureEndsTheJobWithNoRestartsLeft) {
  fs::path d = temp_dir("exhaust");
  std::vector<Agent> agents = two_nodes(d, "exhaust", kRestarts + 1);
  std::string both;
  for (const Agent& a : agents) both += slurp(a.log) + "\n---\n";
  for (const Agent& a : agents) {
    const std::string log = slurp(a.log);
    EXPECT_NE(a.code, 0) << both;
    EXPECT_EQ(count(log, "restarting the workers"), size_t(kRestarts)) << log;
    // The failing node says so; the other names it as the reason the job stopped.
    EXPECT_NE(log.find("; no restarts left (--max-restarts 20)"), std::string::npos) << log;
  }
  EXPECT_NE(both.find("weft run: failed: rank 1 exited with code 1; no restarts left "
                      "(--max-restarts 20)"),
            std::string::npos)
      << both;
  fs::remove_all(d);
}

// --standalone restarts in the same agent process (cmd_run.cc): same soak, one agent.
TEST(RestartSoak, StandaloneAgentRestartsTwentyTimesWithoutGrowing) {
  fs::path d = temp_dir("standalone");
  std::vector<Agent> agents(1);
  agents[0].log = d / "a.log";
  std::vector<std::string> args = {"run", "--standalone",   "--nproc-per-node",
                                   "1",   "--max-restarts", std::to_string(kRestarts),
                                   "--"};
  for (const std::string& w : worker(d, 0, kRestarts)) args.push_back(w);
  agents[0].pid = start_weft(args, agents[0].log.string());
  run_and_sample(agents, d);
  const std::string log = slurp(agents[0].log);
  ASSERT_EQ(agents[0].code, 0) << log;
  EXPECT_EQ(count(log, "restarting the workers"), size_t(kRestarts)) << log;
  expect_no_growth(agents[0], "standalone agent");

  // One failure more than it may restart: the 21st ends the job and says so.
  fs::path e = temp_dir("standalone_exhaust");
  std::vector<Agent> one(1);
  one[0].log = e / "a.log";
  args.resize(7);
  for (const std::string& w : worker(e, 0, kRestarts + 1)) args.push_back(w);
  one[0].pid = start_weft(args, one[0].log.string());
  run_and_sample(one, e);
  const std::string out = slurp(one[0].log);
  EXPECT_EQ(one[0].code, 1) << out;
  EXPECT_EQ(count(out, "restarting the workers"), size_t(kRestarts)) << out;
  EXPECT_NE(out.find("weft run: failed: rank 0 exited with code 1; no restarts left "
                     "(--max-restarts 20)"),
            std::string::npos)
      << out;
  fs::remove_all(d);
  fs::remove_all(e);
}

}  // namespace
}  // namespace weft::test
