// The harness of the online-resize tests (live_resize_test.cc, live_resize_layouts_test.cc):
// one job's `weft run` agents on loopback (one node each, elastic.on_change: reshard), its
// workers found through /proc, its metrics read back, and the single-process run of the same
// job that every resized run must equal. Header-only; every wait is bounded by a patience far
// beyond its need, and the agents (with their workers) are reaped however a test ends.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/elastic/membership_record.h"
#include "comm/store/tcp_store.h"
#include "core/io/metrics.h"
#include "tests/support/agent_tests.h"
#include "tests/support/run_weft.h"

namespace weft::test::live {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using WorldEpoch = std::pair<int, int>;

inline const std::string kToken = "live-resize-test-token";
// A node silent for 2 s is lost; the first epoch forms when all the nodes a test starts
// have arrived (last call 15 s, beyond any start-up delay; max nodes ends it at once).
inline const std::string kConf =
    "heartbeat_interval=0.5,heartbeat_timeout=2,last_call_timeout=15,join_timeout=60";
inline constexpr double kPatience = 120;

inline std::string config_path(const std::string& name) {
  return std::string(WEFT_SOURCE_DIR) + "/configs/" + name;
}

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

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
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
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

// `weft train`'s arguments for `config` (under configs/): global batch 24 in micro-batches
// of 2, a metrics line every step, no validation, then the `sets` overrides.
inline std::vector<std::string> train_args(const std::string& config, const fs::path& out,
                                           int steps, const std::vector<std::string>& sets) {
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

// One process, the same job (no parallel overrides: those are the layout, not the job):
// the numbers every resized run must give. Returns its metrics file.
inline fs::path reference_run(const std::string& config, const fs::path& dir, int steps,
                              const std::vector<std::string>& sets) {
  const fs::path out = dir / "one";
  std::string cmd = std::string(WEFT_BINARY) + " train";
  for (const std::string& a : train_args(config, out, steps, sets)) cmd += " '" + a + "'";
  const auto t0 = Clock::now();
  CommandResult r = run_command("OMP_NUM_THREADS=1 " + cmd);
  EXPECT_EQ(r.code, 0) << r.out;
  std::printf("[ timing ] reference run, %d steps: %.1f s\n", steps, seconds_since(t0));
  return out / "metrics.jsonl";
}

// One job's agents on loopback, one node each (`nproc` workers).
struct LiveJob {
  fs::path dir;
  std::string id;
  std::string config = "gpt-layout.yaml";
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
    for (const std::string& x : train_args(config, out(), steps, s)) argv.push_back(x);
    agents.start(argv, log);
    logs.push_back(log);
    return int(logs.size()) - 1;
  }
  pid_t pid(int k) const { return agents.pids.at(size_t(k)); }
  std::string all_logs() const {
    std::string s;
    for (size_t k = 0; k < logs.size(); ++k)
      s += "--- agent " + std::to_string(k) + "\n" + slurp(logs[k]);
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
        if (!r[i].is_validation() && int(r[i].at("world")) == world)
          return r.size() >= i + 1 + more;
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
  // Agent k's exit code once it ended (nullopt past `limit` seconds); reaps it.
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
  // The lines of agent k's log that hold `text`.
  std::vector<std::string> lines_with(int k, const std::string& text) const {
    std::vector<std::string> out;
    std::istringstream in(slurp(logs.at(size_t(k))));
    for (std::string line; std::getline(in, line);)
      if (line.find(text) != std::string::npos) out.push_back(line);
    return out;
  }
};

// The run's losses against the reference's, step by step, within `rel`: every step once,
// at most `max_missing` without a line (0: a step's statistics are exchanged before any rank
// commits it, so a member lost there sends the survivors back to the step's start).
inline void expect_losses_by_step(const fs::path& reference, const fs::path& run, size_t count,
                                  double rel, size_t max_missing) {
  auto by_step = [](const fs::path& p) {
    std::vector<std::vector<double>> out;
    for (const core::io::MetricsRow& r : core::io::read_metrics(p.string())) {
      if (r.is_validation()) continue;
      const size_t step = size_t(r.at("step"));
      if (out.size() <= step) out.resize(step + 1);
      out[step].push_back(r.at("loss"));
    }
    return out;
  };
  const std::vector<std::vector<double>> a = by_step(reference), b = by_step(run);
  ASSERT_EQ(a.size(), count) << reference;
  ASSERT_LE(b.size(), count) << run;
  std::vector<size_t> missing;
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(a[i].size(), 1u) << reference << " step " << i;
    if (i >= b.size() || b[i].empty()) {
      missing.push_back(i);
      continue;
    }
    EXPECT_EQ(b[i].size(), 1u) << run << ": step " << i << " has several lines";
    EXPECT_NEAR(b[i][0], a[i][0], rel * std::fabs(a[i][0])) << "step " << i;
  }
  std::string text;
  for (size_t i : missing) text += " " + std::to_string(i);
  EXPECT_LE(missing.size(), max_missing) << run << ": no line for steps" << text;
  if (!missing.empty())
    std::printf("no metrics line for steps%s (a member died between the update and the "
                "statistics)\n", text.c_str());
}

inline std::string phases_text(const std::vector<std::pair<WorldEpoch, int>>& p) {
  std::string s;
  for (const auto& [we, n] : p)
    s += "(world " + std::to_string(we.first) + ", epoch " + std::to_string(we.second) + ") x" +
         std::to_string(n) + " ";
  return s;
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
