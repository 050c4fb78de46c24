// The harness of the online-resize tests (elastic.on_change: reshard), header-only: one job's
// `weft run` agents, one node each, on loopback or on VirtualHosts (network namespaces); the
// single-process reference run; the workers of an agent; the (world, epoch) phases of the
// metrics; a process's fds, threads and RSS. Every wait is bounded by a patience far beyond
// its need; agents are SIGKILLed and reaped (with their workers) however the test ends.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <chrono>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/elastic/membership_record.h"
#include "comm/store/tcp_store.h"
#include "core/io/metrics.h"
#include "tests/support/agent_tests.h"
#include "tests/support/metrics_compare.h"
#include "tests/support/netns.h"
#include "tests/support/run_weft.h"

namespace weft::test::live {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using WorldEpoch = std::pair<int, int>;  // a metrics line's (world, epoch)

// configs/<name>: the job's file.
inline std::string config_path(const std::string& name) {
  return std::string(WEFT_SOURCE_DIR) + "/configs/" + name;
}
inline const std::string kLayoutConfig = "gpt-layout.yaml";
// A node silent for 2 s is lost; the first epoch forms when all the nodes a test starts
// have arrived (last call 15 s, beyond any start-up delay; max nodes ends it at once).
inline const std::string kConf =
    "heartbeat_interval=0.5,heartbeat_timeout=2,last_call_timeout=15,join_timeout=60";
inline constexpr double kPatience = 120;
// Data parallelism over 2, 3 or 4 ranks regroups the sums of one process's 12 micro-batches.
inline constexpr double kRelDp = 1e-6;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Polls `done` every 20 ms for at most `limit` seconds.
inline bool poll_until(const std::function<bool()>& done, double limit = kPatience,
                       int every_ms = 20) {
  const auto t0 = Clock::now();
  while (!done()) {
    if (seconds_since(t0) > limit) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(every_ms));
  }
  return true;
}

// The workers the agent `pid` started: its children with a rank in their environment (the
// agent also forks a guardian, which has none).
inline std::vector<pid_t> children(pid_t pid) {
  std::vector<pid_t> out;
  for (pid_t c : child_pids(pid))
    if (slurp(fs::path("/proc") / std::to_string(c) / "environ").find("WEFT_RANK=") !=
        std::string::npos)
      out.push_back(c);
  std::sort(out.begin(), out.end());
  return out;
}

// What a leak shows in: open descriptors, threads and resident memory of a live process
// (-1 each when it is gone).
struct ProcUsage {
  int fds = -1, threads = -1;
  long rss_kib = -1;
};
inline ProcUsage proc_usage(pid_t pid) {
  ProcUsage u;
  const fs::path p = "/proc/" + std::to_string(pid);
  std::error_code ec;
  int fds = 0;
  for (auto it = fs::directory_iterator(p / "fd", ec); !ec && it != fs::directory_iterator();
       it.increment(ec))
    ++fds;
  if (ec) return u;
  u.fds = fds;
  std::istringstream in(slurp(p / "status"));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("Threads:", 0) == 0) u.threads = std::stoi(line.substr(8));
    if (line.rfind("VmRSS:", 0) == 0) u.rss_kib = std::stol(line.substr(6));
  }
  return u;
}

inline std::vector<std::string> train_args(const fs::path& out, int steps,
                                           const std::vector<std::string>& sets,
                                           const std::string& config = kLayoutConfig) {
  std::vector<std::string> a = {"--config", config_path(config),
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
inline fs::path reference_run(const fs::path& dir, int steps,
                              const std::vector<std::string>& sets,
                              const std::string& config = kLayoutConfig) {
  const fs::path out = dir / "one";
  std::string cmd = std::string(WEFT_BINARY) + " train";
  for (const std::string& a : train_args(out, steps, sets, config)) cmd += " '" + a + "'";
  CommandResult r = run_command("OMP_NUM_THREADS=1 " + cmd);
  EXPECT_EQ(r.code, 0) << r.out;
  return out / "metrics.jsonl";
}

// One job's agents, one node each (`nproc` workers): on loopback, or with `hosts` set one
// agent per host (host 0's agent serves the store; the hosts share the filesystem).
struct LiveJob {
  fs::path dir;
  std::string id;
  VirtualHosts* hosts = nullptr;
  int port = 0;  // 0: a free loopback port (29400 on hosts, which have ports of their own)
  int steps = 600;  // 4 ranks make about 50 steps/s on two cores: joins come in time
  int nproc = 1;
  std::string nnodes = "2:4";
  int max_restarts = 0;
  std::string conf = kConf;
  std::string token = "live-resize-test-token";
  std::string config = kLayoutConfig;  // under configs/
  std::vector<std::string> sets;  // the job's --set overrides beyond train_args'
  std::vector<std::string> env;   // beyond OMP_NUM_THREADS=1 and the token
  Agents local;                   // loopback agents (reaped by its destructor)
  std::vector<pid_t> pids;        // by agent index; -1 once waited for
  std::vector<int> host_of;       // by agent index; -1 on loopback
  std::vector<fs::path> logs;

  fs::path out() const { return dir / "out"; }
  fs::path metrics() const { return out() / "metrics.jsonl"; }
  std::string store_host() const { return hosts ? hosts->hostname(0) : "127.0.0.1"; }
  std::string store_address() const { return hosts ? hosts->address(0) : "127.0.0.1"; }

  // Starts an agent (on `host` when the job has hosts) and returns its index.
  int start(int host = -1) {
    if (port == 0) port = hosts ? 29400 : free_port();
    const fs::path log = dir / ("agent" + std::to_string(logs.size()) + ".log");
    std::vector<std::string> argv = {"run", "--nnodes", nnodes, "--nproc-per-node",
                                     std::to_string(nproc), "--max-restarts",
                                     std::to_string(max_restarts), "--rdzv-backend", "c10d",
                                     "--rdzv-id", id, "--rdzv-endpoint",
                                     store_host() + ":" + std::to_string(port), "--rdzv-conf",
                                     conf, "--", WEFT_BINARY, "train"};
    std::vector<std::string> s = sets;
    s.push_back("elastic.on_change=reshard");
    for (const std::string& x : train_args(out(), steps, s, config)) argv.push_back(x);
    std::vector<std::string> e = {"WEFT_JOB_TOKEN=" + token, "OMP_NUM_THREADS=1"};
    e.insert(e.end(), env.begin(), env.end());
    if (hosts) {
      argv.insert(argv.begin(), WEFT_BINARY);
      pids.push_back(hosts->start(host, argv, log.string(), e));
    } else {
      pids.push_back(local.start(argv, log, e));
    }
    host_of.push_back(hosts ? host : -1);
    logs.push_back(log);
    return int(logs.size()) - 1;
  }
  pid_t pid(int k) const { return pids.at(size_t(k)); }
  std::string text(int k) const { return slurp(logs.at(size_t(k))); }
  // Waits (kPatience) until some agent's log holds `t`.
  bool wait_line_anywhere(const std::string& t) const {
    return poll_until([&] {
      for (int k = 0; k < int(logs.size()); ++k)
        if (!lines_with(k, t).empty()) return true;
      return false;
    });
  }
  // The lines of agent k's log that hold `text`.
  std::vector<std::string> lines_with(int k, const std::string& t) const {
    std::vector<std::string> out;
    std::istringstream in(text(k));
    for (std::string line; std::getline(in, line);)
      if (line.find(t) != std::string::npos) out.push_back(line);
    return out;
  }
  std::string all_logs() const {
    std::string s;
    for (size_t k = 0; k < logs.size(); ++k)
      s += "--- agent " + std::to_string(k) + "\n" + slurp(logs[k]);
    return s;
  }
  // Waiting nodes before epoch 1 (the record in the store the first agent serves).
  size_t waiting() {
    size_t n = 0;
    auto read = [&] {
      comm::TCPStore store(comm::TCPStoreOptions{store_address(), uint16_t(port),
                                                 std::chrono::milliseconds(5'000), token});
      const std::string key = "rdzv/" + id + "/state";
      if (store.check({key})) n = comm::decode(comm::to_string(store.get(key)), key).spares.size();
    };
    try {
      hosts ? hosts->in_host(0, read) : read();
    } catch (const std::exception&) {
      return 0;
    }
    return n;
  }
  // Starts `n` agents one after the other (on hosts 0 .. n-1 when the job has hosts), so
  // that agent i gets node rank i.
  void start_in_order(int n) {
    for (int i = 0; i < n; ++i) {
      start(hosts ? i : -1);
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
  // Waits until a metrics line of world `world` (and epoch >= `epoch`) exists and `more`
  // lines have followed it.
  bool wait_world(int world, size_t more = 0, int epoch = 0, double limit = kPatience) {
    return poll_until(
        [&] {
          std::vector<core::io::MetricsRow> r = rows();
          for (size_t i = 0; i < r.size(); ++i)
            if (!r[i].is_validation() && int(r[i].at("world")) == world &&
                int(r[i].at("epoch")) >= epoch)
              return r.size() >= i + 1 + more;
          return false;
        },
        limit);
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
  bool ended(int k) {
    if (hosts) return hosts->ended(pid(k));
    if (codes_.count(k)) return true;
    int status = 0;
    if (::waitpid(pid(k), &status, WNOHANG) != pid(k)) return false;
    codes_[k] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    for (pid_t& p : local.pids)
      if (p == pid(k)) p = -1;
    return true;
  }
  // Agent k's exit code (128 + signal when killed); nullopt when it still runs after `limit`.
  std::optional<int> wait(int k, double limit = kPatience) {
    if (!poll_until([&] { return ended(k); }, limit)) return std::nullopt;
    if (hosts) return hosts->wait(pid(k));
    return codes_.at(k);
  }
  // Waits for each agent of `agents` and expects it to exit with `code` (a failure naming
  // the logs otherwise).
  void expect_exits(std::initializer_list<int> agents, int code = 0) {
    for (int k : agents) {
      const std::optional<int> got = wait(k);
      if (!got) ADD_FAILURE() << "agent " << k << " still runs\n" << all_logs();
      else EXPECT_EQ(*got, code) << "agent " << k << "\n" << all_logs();
    }
  }
  // Agent k lost whole, as a host that dies: its one worker, then the agent, SIGKILLed.
  void kill_whole(int k) {
    const std::vector<pid_t> worker = children(pid(k));
    ASSERT_EQ(worker.size(), 1u) << all_logs();
    ::kill(worker[0], SIGKILL);
    ::kill(pid(k), SIGKILL);
    EXPECT_EQ(wait(k), 128 + SIGKILL);
  }
  // Agent 0's last resize line of the change `change` ("epoch 2 -> 3"), printed for the
  // record (its first 500 characters); "" when there is none.
  std::string resize_line(const std::string& change) const {
    std::string line;
    for (const std::string& l : lines_with(0, "resize: epoch"))
      if (l.find(change) != std::string::npos) line = l;
    std::printf("[ says     ] %s\n", line.substr(0, 500).c_str());
    return line;
  }
  // Whether agent k's snapshot agent committed parity of `epoch` (snapshot.redundancy: ec;
  // its first commit of each epoch is logged).
  bool holds_parity_of(int k, int epoch) const {
    static const std::regex re(R"(holding parity fragment \d+ of stripe \d+ \(epoch (\d+)\))");
    for (const std::string& l : lines_with(k, "holding parity fragment")) {
      std::smatch m;
      if (std::regex_search(l, m, re) && std::stoi(m[1]) == epoch) return true;
    }
    return false;
  }
  // Agent k's one line with `text`, printed for the record; "" (and a failure) unless there
  // is exactly one.
  std::string only_line(int k, const std::string& text) const {
    const std::vector<std::string> r = lines_with(k, text);
    if (r.size() != 1) {
      ADD_FAILURE() << r.size() << " lines with \"" << text << "\" from agent " << k
                    << ", expected one\n"
                    << all_logs();
      return "";
    }
    std::printf("[ says     ] %s\n", r[0].c_str());
    return r[0];
  }
  // Agent 0's one resize line (only_line).
  std::string only_resize_line() const { return only_line(0, "resize: epoch"); }

 private:
  std::map<int, int> codes_;  // loopback agents' exit codes, once reaped
};

// The run's losses against one process's, by step: no step twice or out of order, none
// missing (a step's statistics are exchanged before any rank commits it, so a member lost
// there sends every survivor back to the step's start: it is redone and gets its line), each
// line within `rel`. Returns the steps without a line (printed; a failure).
inline std::vector<int64_t> expect_losses_by_step(const fs::path& reference,
                                                  const fs::path& run, double rel) {
  const std::vector<double> ref = metrics_losses(reference);
  std::vector<int64_t> missing;
  int64_t next = 0;
  for (const core::io::MetricsRow& row : core::io::read_metrics(run.string())) {
    if (row.is_validation()) continue;
    const int64_t step = int64_t(row.at("step"));
    EXPECT_GE(step, next) << "step " << step << " repeated or out of order";
    for (; next < step; ++next) missing.push_back(next);
    next = step + 1;
    if (size_t(step) < ref.size()) {
      EXPECT_NEAR(row.at("loss"), ref[size_t(step)], rel * std::fabs(ref[size_t(step)]))
          << "step " << step;
    }
  }
  for (; next < int64_t(ref.size()); ++next) missing.push_back(next);
  std::string list;
  for (int64_t s : missing) list += " " + std::to_string(s);
  EXPECT_TRUE(missing.empty()) << missing.size() << " steps without a metrics line:" << list;
  return missing;
}

inline std::string phases_text(const std::vector<std::pair<WorldEpoch, int>>& p) {
  std::string s;
  for (const auto& [we, n] : p) {
    s += "(world " + std::to_string(we.first);
    s += ", epoch " + std::to_string(we.second);
    s += ") x" + std::to_string(n) + " ";
  }
  return s;
}

// Every line of `log` that holds `s`.
inline std::vector<std::string> lines_with(const std::string& log, const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);)
    if (line.find(s) != std::string::npos) out.push_back(line);
  return out;
}

// The resize line after a kill (or a log with that one resize) took the state from the
// survivors. Usually every survivor holds the newest step. A kill that lands while the step's statistics exchange goes round
// lets the survivors it reached update to the next step and leaves the others one step
// behind (parallel/trainer.h, step()): then fewer of them hold the newest step, and the
// router sends those behind a replica (bytes between ranks). Either is the failure path
// working; a line with neither is not.
inline void expect_state_from_survivors(const std::string& line, int survivors) {
  static const std::regex re(
      R"(from (\d+) holders? through the router(?: \(|, )([0-9.]+) MiB between ranks)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(line, m, re)) << line;
  const int holders = std::stoi(m[1]);
  if (holders == survivors) return;
  EXPECT_GE(holders, 1) << line;
  EXPECT_LT(holders, survivors) << line;
  EXPECT_GT(std::stod(m[2]), 0) << "those one step behind get a replica\n" << line;
  std::printf("[ says     ] %d of %d survivors held the newest step (the kill caught its "
              "statistics exchange)\n", holders, survivors);
}

// The phases' worlds are `worlds` in order, the first in epoch 1, each later one in a later
// epoch than the one before.
inline void expect_phases(const std::vector<std::pair<WorldEpoch, int>>& p,
                          const std::vector<int>& worlds) {
  ASSERT_EQ(p.size(), worlds.size()) << phases_text(p);
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_EQ(p[i].first.first, worlds[i]) << phases_text(p);
    if (i == 0) {
      EXPECT_EQ(p[i].first.second, 1) << phases_text(p);
    } else {
      EXPECT_GT(p[i].first.second, p[i - 1].first.second) << phases_text(p);
    }
  }
}

}  // namespace weft::test::live
