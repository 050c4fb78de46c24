// A worker's silence counts only time in which its agent was watching: when the agent and its
// workers were all stopped together (a VM paused, a host suspended, a cgroup frozen, a
// machine so loaded that nothing ran) and the agent runs first afterwards, its workers are
// not declared hung; a worker whose heartbeat thread is runnable is starved, not hung. A
// worker that stays stopped is still killed after --worker-heartbeat-timeout. Real processes
// and real signals (SIGSTOP, SIGCONT); the workers are shells that beat on the agent's socket
// (fd 3) as `weft train`'s heartbeat thread does, or `weft train` itself under a CPU quota
// (a cgroup: root only, skipped elsewhere). Every process is reaped, on failure too.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/proc.h"
#include "tests/support/agent_tests.h"
#include "tests/support/run_weft.h"

namespace weft::test {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// A hang guard for each wait below, never a timing expectation.
constexpr auto kLimit = std::chrono::seconds(60);

// The agent and its workers: SIGCONT and SIGKILL to each, the agent reaped, however the
// test ends (a worker dies with its agent too: PR_SET_PDEATHSIG).
struct Job {
  pid_t agent = -1;
  std::set<pid_t> workers;
  ~Job() {
    for (pid_t p : workers) ::kill(p, SIGCONT), ::kill(p, SIGKILL);
    if (agent > 0) {
      ::kill(agent, SIGCONT);
      ::kill(agent, SIGKILL);
      ::waitpid(agent, nullptr, 0);
    }
  }
  // Waits (at most kLimit) for the agent's exit; its exit code, or -1 when it had to be killed.
  int wait_exit() {
    int status = 0;
    const auto until = Clock::now() + kLimit;
    while (::waitpid(agent, &status, WNOHANG) == 0) {
      if (Clock::now() > until) return -1;  // the destructor kills and reaps it
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    agent = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
};

// Polls `check` every 20 ms while the agent runs, for at most kLimit.
template <typename F>
bool wait_while_running(Job& job, F check) {
  const auto until = Clock::now() + kLimit;
  while (Clock::now() < until) {
    if (check()) return true;
    siginfo_t info{};
    if (::waitid(P_PID, id_t(job.agent), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
        info.si_pid == job.agent)
      return check();  // it ended (left for wait_exit to reap)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return check();
}

// The scheduler's state of `pid` ('R', 'S', 'T', ...; '?' when gone).
char state_of(pid_t pid) {
  std::string stat = slurp("/proc/" + std::to_string(pid) + "/stat");
  size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() ? stat[close + 2] : '?';
}

// An int written whole to `p` (renamed into place), or -1.
int read_int(const fs::path& p) {
  std::string s = slurp(p);
  return s.empty() ? -1 : std::stoi(s);
}

// Gone: reaped, or a zombie waiting for its reaper.
bool gone(pid_t pid) {
  const char s = state_of(pid);
  return s == '?' || s == 'Z' || s == 'X';
}

bool contains(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

// A worker that writes its pid to D/pid_$RANK, then beats every 0.1 s (counting its beats
// in D/beats_$RANK) until D/done exists, and ends with 0, naming its pid.
std::vector<std::string> beating_worker(const fs::path& d) {
  const std::string D = d.string();
  return {"sh", "-c",
          "echo $$ > " + D + "/pid_$RANK.t && mv " + D + "/pid_$RANK.t " + D + "/pid_$RANK; n=0; " +
              "while [ ! -e " + D + "/done ]; do printf h >&3; n=$((n+1)); echo $n > " + D +
              "/beats_$RANK.t; mv " + D + "/beats_$RANK.t " + D + "/beats_$RANK; sleep 0.1; " +
              "done; echo rank $RANK pid $$ finished after $n beats"};
}

// `weft run --standalone` with heartbeats every 0.1 s and `timeout` seconds of silence allowed.
std::vector<std::string> run_args(int nproc, const std::vector<std::string>& cmd,
                                  const std::string& timeout = "1") {
  std::vector<std::string> a = {"run",
                                "--standalone",
                                "--nproc-per-node",
                                std::to_string(nproc),
                                "--worker-heartbeat-interval",
                                "0.1",
                                "--worker-heartbeat-timeout",
                                timeout,
                                "--"};
  a.insert(a.end(), cmd.begin(), cmd.end());
  return a;
}

// A cgroup whose CPU quota is 1 ms per 1 s period (cgroup v1's cpu controller, or v2's
// cpu.max): a task in it is throttled, runnable (R) but not run, for most of each second.
// ok is false where no such cgroup can be made (not root, no cpu controller). Its tasks go
// back to the parent and it is removed however the test ends.
struct CpuQuotaGroup {
  fs::path dir, parent;
  bool ok = false;
  CpuQuotaGroup() {
    const std::string name = "weft_stall_test_" + std::to_string(::getpid());
    if (fs::exists("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")) {
      parent = "/sys/fs/cgroup/cpu";
      dir = parent / name;
      std::error_code ec;
      ok = fs::create_directory(dir, ec) && write(dir / "cpu.cfs_period_us", "1000000") &&
           write(dir / "cpu.cfs_quota_us", "1000");
    } else if (slurp("/sys/fs/cgroup/cgroup.subtree_control").find("cpu") != std::string::npos) {
      parent = "/sys/fs/cgroup";
      dir = parent / name;
      std::error_code ec;
      ok = fs::create_directory(dir, ec) && write(dir / "cpu.max", "1000 1000000");
    }
  }
  ~CpuQuotaGroup() { release(); }
  // Its tasks back to the parent, and the group removed.
  void release() {
    if (dir.empty()) return;
    std::istringstream procs(slurp(dir / "cgroup.procs"));
    for (std::string pid; procs >> pid;) write(parent / "cgroup.procs", pid);
    std::error_code ec;
    fs::remove(dir, ec);
    dir.clear();
  }
  static bool write(const fs::path& p, const std::string& value) {
    std::ofstream f(p);
    f << value << std::flush;
    return bool(f);
  }
  bool add(pid_t pid) { return write(dir / "cgroup.procs", std::to_string(pid)); }
};

// Starts two beating workers and waits until both beat; fills job.workers (rank order).
std::vector<pid_t> start_beating(Job& job, const fs::path& d) {
  job.agent = start_weft(run_args(2, beating_worker(d)), (d / "out.txt").string());
  std::vector<pid_t> pids;
  bool up = wait_while_running(job, [&] {
    return read_int(d / "beats_0") >= 3 && read_int(d / "beats_1") >= 3 &&
           read_int(d / "pid_0") > 0 && read_int(d / "pid_1") > 0;
  });
  if (!up) return pids;
  for (int r : {0, 1}) pids.push_back(pid_t(read_int(d / ("pid_" + std::to_string(r)))));
  job.workers.insert(pids.begin(), pids.end());
  return pids;
}

// Stops the agent and then its workers (the whole job, as a paused machine does), waits until
// all of them are stopped and then three heartbeat timeouts, and continues the agent alone.
// Returns once the agent made a pass of its loop after the stall (it names the stall or a
// hung worker), or false.
bool stall_then_continue_agent(Job& job, const std::vector<pid_t>& workers, const fs::path& d) {
  ::kill(job.agent, SIGSTOP);
  for (pid_t w : workers) ::kill(w, SIGSTOP);
  bool stopped = wait_while_running(job, [&] {
    bool all = state_of(job.agent) == 'T';
    for (pid_t w : workers) all = all && state_of(w) == 'T';
    return all;
  });
  if (!stopped) return false;
  std::this_thread::sleep_for(std::chrono::seconds(3));  // the stall: 3x the 1 s timeout
  ::kill(job.agent, SIGCONT);
  return wait_while_running(job, [&] {
    std::string out = slurp(d / "out.txt");
    return contains(out, "this agent did not run for") || contains(out, "sent no heartbeat");
  });
}

// The whole job stopped for 3 s (heartbeat timeout 1 s); the agent continues first and makes
// a pass while its workers are still stopped; then they continue. Nobody is killed: the job
// completes with exit 0 and the same worker pids, and the agent names its own stall.
TEST(SupervisionStall, JobStoppedTogetherAndAgentFirstKillsNoWorker) {
  fs::path d = agent_test_dir("stall", "together");
  Job job;
  std::vector<pid_t> workers = start_beating(job, d);
  ASSERT_EQ(workers.size(), 2u) << slurp(d / "out.txt");
  ASSERT_TRUE(stall_then_continue_agent(job, workers, d)) << slurp(d / "out.txt");
  for (pid_t w : workers) EXPECT_EQ(state_of(w), 'T') << w;  // still stopped at that pass
  std::vector<int> before = {read_int(d / "beats_0"), read_int(d / "beats_1")};
  for (pid_t w : workers) ::kill(w, SIGCONT);
  // Both beat again (three times each) after the stall, in the same processes.
  EXPECT_TRUE(wait_while_running(job, [&] {
    return read_int(d / "beats_0") >= before[0] + 3 && read_int(d / "beats_1") >= before[1] + 3;
  })) << slurp(d / "out.txt");
  for (pid_t w : workers) EXPECT_FALSE(gone(w)) << w;
  ::close(::open((d / "done").c_str(), O_CREAT | O_WRONLY, 0644));
  const int code = job.wait_exit();
  const std::string out = slurp(d / "out.txt");
  EXPECT_EQ(code, 0) << out;
  EXPECT_FALSE(contains(out, "sent no heartbeat")) << out;
  EXPECT_TRUE(contains(out, "this agent did not run for")) << out;
  for (int r : {0, 1})
    EXPECT_TRUE(contains(out, "rank " + std::to_string(r) + " pid " +
                                  std::to_string(workers[size_t(r)]) + " finished after"))
        << out;
  fs::remove_all(d);
}

// The same stall, but the workers stay stopped: once the agent watched them for the timeout
// it kills them as hung and the job fails (exit 1), naming a rank and its pid.
TEST(SupervisionStall, WorkersStillStoppedAfterTheAgentsStallAreKilledAsHung) {
  fs::path d = agent_test_dir("stall", "stillstopped");
  Job job;
  std::vector<pid_t> workers = start_beating(job, d);
  ASSERT_EQ(workers.size(), 2u) << slurp(d / "out.txt");
  ASSERT_TRUE(stall_then_continue_agent(job, workers, d)) << slurp(d / "out.txt");
  const int code = job.wait_exit();
  const std::string out = slurp(d / "out.txt");
  EXPECT_EQ(code, 1) << out;
  const size_t stall = out.find("this agent did not run for");
  EXPECT_NE(stall, std::string::npos) << out;
  bool named = false;
  for (int r : {0, 1})
    named =
        named || contains(out, "rank " + std::to_string(r) + " (pid " +
                                   std::to_string(workers[size_t(r)]) + ") sent no heartbeat for ");
  EXPECT_TRUE(named) << out;
  EXPECT_GT(out.find("sent no heartbeat"), stall) << out;  // after the stall was set aside
  for (pid_t w : workers) EXPECT_TRUE(gone(w)) << w;
  fs::remove_all(d);
}

// A worker whose heartbeat thread is runnable but silent (here a process named like the
// thread, `weft-heartbeat`, that beats once and then spins: state R, as a starved thread's)
// is starved, not hung: the agent says so and keeps it. Stopped (state T), it is killed and
// the job fails (exit 1).
TEST(SupervisionStall, RunnableHeartbeatThreadIsStarvedNotHungUntilItStops) {
  fs::path d = agent_test_dir("stall", "starved");
  fs::create_symlink("/bin/sh", d / "weft-heartbeat");  // the process's comm: weft-heartbeat
  Job job;
  job.agent = start_weft(
      run_args(1, {(d / "weft-heartbeat").string(), "-c",
                   "echo $$ > " + (d / "pid.t").string() + " && mv " + (d / "pid.t").string() +
                       " " + (d / "pid").string() + "; printf h >&3; while :; do :; done"}),
      (d / "out.txt").string());
  ASSERT_TRUE(wait_while_running(job, [&] { return read_int(d / "pid") > 0; }))
      << slurp(d / "out.txt");
  const pid_t worker = pid_t(read_int(d / "pid"));
  job.workers.insert(worker);
  const std::string starved = "rank 0 (pid " + std::to_string(worker) + ") sent no heartbeat for ";
  ASSERT_TRUE(wait_while_running(job, [&] {
    std::string out = slurp(d / "out.txt");
    return contains(out, "starved, not hung") || contains(out, "hung or stopped");
  })) << slurp(d / "out.txt");
  std::string out = slurp(d / "out.txt");
  EXPECT_TRUE(contains(out, starved) && contains(out, "heartbeat thread is runnable")) << out;
  EXPECT_EQ(state_of(worker), 'R') << out;  // kept: still running
  ::kill(worker, SIGSTOP);
  const int code = job.wait_exit();
  out = slurp(d / "out.txt");
  EXPECT_EQ(code, 1) << out;
  EXPECT_TRUE(contains(out, starved) && contains(out, "hung or stopped")) << out;
  EXPECT_TRUE(gone(worker)) << out;
  fs::remove_all(d);
}

// A real starved worker: `weft train` (heartbeat 0.1 s / 0.5 s) put in a cgroup with a CPU
// quota of 1 ms per second. Its heartbeat thread is throttled, runnable but not run, for
// longer than the timeout; the agent names it starved and keeps it (main's agent killed it:
// "sent no heartbeat for 0.5 s: hung or stopped"). Released, it trains on; SIGTERM stops it.
TEST(SupervisionStall, WorkerThrottledByACpuQuotaIsStarvedNotHung) {
  CpuQuotaGroup group;
  if (!group.ok) GTEST_SKIP() << "needs a cgroup with a CPU quota (root, a cpu controller)";
  fs::path d = agent_test_dir("stall", "quota");
  Job job;
  job.agent = start_weft(run_args(1,
                                  {WEFT_BINARY, "train", "--config",
                                   std::string(WEFT_SOURCE_DIR) + "/configs/gpt-layout.yaml",
                                   "--set", "train.steps=100000", "--set", "train.log_every=1",
                                   "--set", "train.out_dir=" + (d / "run").string()},
                                  "0.5"),
                         (d / "out.txt").string());
  ASSERT_TRUE(wait_while_running(job, [&] { return contains(slurp(d / "out.txt"), "| loss"); }))
      << slurp(d / "out.txt");
  const pid_t worker = worker_child(job.agent, 0);
  ASSERT_GT(worker, 0) << slurp(d / "out.txt");
  job.workers.insert(worker);
  ASSERT_TRUE(group.add(worker));
  EXPECT_TRUE(wait_while_running(job, [&] {
    std::string out = slurp(d / "out.txt");
    return contains(out, "starved, not hung") || contains(out, "hung or stopped");
  })) << slurp(d / "out.txt");
  group.release();
  const size_t released_at = slurp(d / "out.txt").size();
  std::string out = slurp(d / "out.txt");
  EXPECT_TRUE(contains(out, "rank 0 (pid " + std::to_string(worker) + ") sent no heartbeat for ") &&
              contains(out, "heartbeat thread is runnable (waiting for a CPU): starved, not hung"))
      << out;
  // It trains on in the same process: a step logged after its release.
  EXPECT_TRUE(wait_while_running(job, [&] {
    return slurp(d / "out.txt").find("| loss", released_at) != std::string::npos;
  })) << slurp(d / "out.txt");
  EXPECT_FALSE(gone(worker));
  ::kill(job.agent, SIGTERM);
  const int code = job.wait_exit();
  out = slurp(d / "out.txt");
  EXPECT_EQ(code, 143) << out;
  EXPECT_FALSE(contains(out, "hung or stopped")) << out;
  fs::remove_all(d);
}

}  // namespace
}  // namespace weft::test
