// A soak of online resize: one loopback job of three nodes (elastic.on_change: reshard,
// --nnodes 2:3, --max-restarts 20) whose non-store nodes lose their worker to SIGKILL again and
// again; each such worker is replaced in place (a renewed epoch, world 3 -> 3; before
// replacement, its node left and rejoined as a newcomer: 3 -> 2 -> 3). After 20
// membership changes the run must still equal one process's, the store node's worker (which
// lives through every change) must not grow in descriptors, threads or memory, and no router
// segment may be left in /dev/shm. Times and usage are printed; every wait is bounded.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <set>

#include "tests/support/live_job.h"
#include "tests/support/metrics_compare.h"

namespace weft::test {
namespace {

using namespace live;

constexpr int kChanges = 20;
// Enough steps for the 20 changes with room to spare (measured: the soak uses 80 to 100 of
// them, about 8 s; 156 in 27 s with the machine's load at 14 on two cores), few enough that
// the rest of the run and its reference are short.
constexpr int kSteps = 400;
// A change back at 3 nodes: the leave, the newcomer's admission (about two heartbeat
// intervals), its worker's start and the transfer: measured 0.6 to 1.1 s.
constexpr double kCyclePatience = 60;

int last_epoch(const LiveJob& job) {
  int e = 0;
  for (const core::io::MetricsRow& r : job.rows())
    if (!r.is_validation()) e = std::max(e, int(r.at("epoch")));
  return e;
}

std::vector<std::string> resize_lines(const LiveJob& job) {
  std::vector<std::string> out;
  for (size_t k = 0; k < job.logs.size(); ++k)
    for (const std::string& l : lines_with(job.text(int(k)), "resize: epoch")) out.push_back(l);
  return out;
}

// /dev/shm entries of weft's (the router's "weft-router-<pid>-..." or any "weft_") that name
// one of `pids`.
std::vector<std::string> shm_left(const std::set<pid_t>& pids) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/dev/shm", ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("weft", 0) != 0) continue;
    for (pid_t p : pids)
      if (n.find("-" + std::to_string(p) + "-") != std::string::npos ||
          n.find("_" + std::to_string(p)) != std::string::npos)
        out.push_back(n);
  }
  return out;
}

struct Sample {
  int changes = 0;
  double at_s = 0;
  ProcUsage worker, agent;  // the store node's (agent 0's) worker and agent
};

TEST(LiveResizeSoak, TwentyChangesKeepTheNumbersAndLeakNothing) {
  const auto t_test = Clock::now();
  LiveJob job;
  job.dir = agent_test_dir("live_resize", "soak");
  job.id = "live-soak";
  job.nnodes = "2:3";
  job.max_restarts = kChanges;
  job.steps = kSteps;
  job.sets = {"parallel.dp=auto"};
  // The router's byte counts; and a 15 s bound on waits for a peer: a world entry that a
  // newer epoch replaced while its Gloo pairs were connecting waits out that bound (the
  // connect is not cancellable yet; seen about once in six soaks), not the default 60 s.
  // Two malloc arenas: glibc makes a new arena whenever threads contend on malloc, so under
  // load a worker's RSS rose up to 3.6 MiB over the soak and then stayed flat (the suite at
  // -j 2), which is arenas filling, not a leak; with two, the bound below measures leaks.
  // Measured beside 3 busy loops, growth from change 2 to 20: 1704 and 908 KiB with glibc's
  // default, 564 and 68 KiB with two arenas.
  job.env = {"WEFT_LOG_LEVEL=debug", "WEFT_LOG_SUBSYS=router", "WEFT_COMM_TIMEOUT_MS=15000",
             "MALLOC_ARENA_MAX=2"};
  const fs::path ref = reference_run(job.dir, job.steps, job.sets);
  std::printf("[ measured ] reference run %.1f s\n", seconds_since(t_test));
  const auto t_job = Clock::now();
  ASSERT_NO_FATAL_FAILURE(job.start_in_order(3));
  ASSERT_TRUE(job.wait_world(3, 10)) << job.all_logs();
  const std::vector<pid_t> lead = children(job.pid(0));
  ASSERT_EQ(lead.size(), 1u) << job.all_logs();
  std::set<pid_t> seen(lead.begin(), lead.end());
  for (int k = 0; k < 3; ++k) seen.insert(job.pid(k));
  std::vector<Sample> samples = {{0, seconds_since(t_job), proc_usage(lead[0]),
                                  proc_usage(job.pid(0))}};
  // Kill node 1's and node 2's workers in turn, each time once the job is back at 3 nodes.
  // A change is a new membership epoch; a world of 2 replaced before it formed (the newcomer
  // came back meanwhile) is one its ranks never enter, so there are fewer resize lines.
  for (int kill = 0; last_epoch(job) < 1 + kChanges && kill < 2 * kChanges; ++kill) {
    const int k = 1 + kill % 2;
    const std::vector<pid_t> w = children(job.pid(k));
    ASSERT_EQ(w.size(), 1u) << "agent " << k << "\n" << job.all_logs();
    seen.insert(w[0]);
    const int at = last_epoch(job);
    const auto t0 = Clock::now();
    ASSERT_EQ(::kill(w[0], SIGKILL), 0);
    ASSERT_TRUE(job.wait_world(3, 5, at + 1, kCyclePatience))
        << "not back at 3 nodes after kill " << kill << ": " << phases_text(job.phases())
        << job.all_logs();
    const double back = seconds_since(t0);
    ASSERT_EQ(children(job.pid(0)), lead) << "the store node's worker was replaced";
    for (int j : {1, 2})
      for (pid_t p : children(job.pid(j))) seen.insert(p);
    samples.push_back({last_epoch(job) - 1, seconds_since(t_job), proc_usage(lead[0]),
                       proc_usage(job.pid(0))});
    std::printf("[ measured ] kill %2d (node %d): back at 3 nodes after %.2f s; %d changes\n",
                kill + 1, k, back, samples.back().changes);
  }
  const int steps_used = job.rows().empty() ? 0 : int(job.rows().size());
  std::printf("[ measured ] %d changes in %.1f s, %d of %d steps\n", samples.back().changes,
              seconds_since(t_job), steps_used, kSteps);
  for (int k = 0; k < 3; ++k) {
    std::optional<int> code = job.wait(k);
    ASSERT_TRUE(code) << "agent " << k << " still runs\n" << job.all_logs();
    EXPECT_EQ(*code, 0) << job.all_logs();
  }
  std::printf("[ measured ] job %.1f s, test %.1f s\n", seconds_since(t_job),
              seconds_since(t_test));

  // 20 changes; every world entered took the survivors' state (never a checkpoint or the
  // seed: this job has no checkpoint, and the seed would start over from step 0).
  EXPECT_GE(last_epoch(job), 1 + kChanges) << phases_text(job.phases());
  const std::vector<std::string> resizes = resize_lines(job);
  std::printf("[ measured ] %zu worlds entered by resize, %zu epochs replaced before they formed\n",
              resizes.size(), lines_with(job.all_logs(), " not entered (").size());
  for (const std::string& l : resizes)
    EXPECT_NE(l.find(" through the router ("), std::string::npos) << l;
  const auto p = job.phases();
  ASSERT_FALSE(p.empty());
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_TRUE(p[i].first.first == 2 || p[i].first.first == 3) << phases_text(p);
    if (i > 0) {
      EXPECT_GT(p[i].first.second, p[i - 1].first.second) << phases_text(p);
    }
  }
  EXPECT_EQ(p.back().first.first, 3) << phases_text(p);
  expect_losses_by_step(ref, job.metrics(), kRelDp);

  // Usage of the worker that lived through every change, after each return to 3 nodes.
  std::printf("[ measured ] changes   worker fds threads rss_kib   agent fds threads rss_kib\n");
  for (const Sample& s : samples)
    std::printf("[ measured ] %7d   %10d %7d %7ld   %9d %7d %7ld\n", s.changes, s.worker.fds,
                s.worker.threads, s.worker.rss_kib, s.agent.fds, s.agent.threads,
                s.agent.rss_kib);
  // Measured (four runs, 20 changes each): fds and threads never moved (worker 15 and 9,
  // agent 27 and 5); the worker's RSS grows 3 to 4.5 MiB over the first 4 changes (the
  // router's and the new worlds' first allocations), then 0.3 to 0.9 MiB over the next 16;
  // the agent's 6 KiB per change (0.1 MiB over 16). Bounds: equal counts, and 3 MiB (worker)
  // and 1 MiB (agent) after the first 4 changes, over 3x the largest growth measured.
  ASSERT_GE(samples.size(), 4u);
  const Sample& settled = samples[2];  // after 4 changes: every kind of resize seen twice
  for (size_t i = 2; i < samples.size(); ++i) {
    EXPECT_EQ(samples[i].worker.fds, settled.worker.fds) << "after " << samples[i].changes;
    EXPECT_EQ(samples[i].worker.threads, settled.worker.threads) << "after " << samples[i].changes;
    EXPECT_EQ(samples[i].agent.fds, settled.agent.fds) << "after " << samples[i].changes;
    EXPECT_EQ(samples[i].agent.threads, settled.agent.threads) << "after " << samples[i].changes;
  }
  EXPECT_LT(samples.back().worker.rss_kib - settled.worker.rss_kib, 3 * 1024);
  EXPECT_LT(samples.back().agent.rss_kib - settled.agent.rss_kib, 1024);

  const std::vector<std::string> left = shm_left(seen);
  EXPECT_TRUE(left.empty()) << left.size() << " segments left, e.g. " << left[0];
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);  // kept for a look otherwise
}

}  // namespace
}  // namespace weft::test
