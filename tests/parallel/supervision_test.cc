// `weft run` supervises its workers with real processes and real signals: workers and their
// children die with the agent (SIGKILL included) and the store's port is free again; SIGTERM
// and SIGHUP stop them within --grace; a stopped worker is named by its missing heartbeat,
// long before the collective timeout; the root cause is the rank that failed first; logs go
// where --log-dir, --redirects, --tee and --local-ranks-filter say; torchrun's variables.
// Every test reaps what it started, on failure too (Reaper).
#include <fcntl.h>
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
#include <set>
#include <sstream>
#include <thread>

#include "base/proc.h"
#include "tests/support/metrics_compare.h"
#include "tests/support/run_weft.h"

namespace weft::test {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
const std::string kWeft = WEFT_BINARY;
const std::string kConfig = std::string(WEFT_SOURCE_DIR) + "/configs/gpt-layout.yaml";

fs::path temp_dir(const std::string& name) {
  fs::path d =
      fs::temp_directory_path() / ("weft_super_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A process that exists and is not a zombie (an orphan's zombie may wait for PID 1).
bool alive(pid_t pid) { return pid > 0 && ::kill(pid, 0) == 0 && weft::process_running(pid); }

// Kills (SIGKILL) and reaps every pid it was given when the test ends, however it ends.
struct Reaper {
  std::set<pid_t> pids;
  pid_t agent = -1;
  ~Reaper() {
    for (pid_t p : pids)
      if (alive(p)) ::kill(p, SIGCONT), ::kill(p, SIGKILL);
    if (agent > 0) {
      ::kill(agent, SIGKILL);
      ::waitpid(agent, nullptr, 0);
    }
  }
};

// Waits for the exit of `pid` (at most `limit`, then SIGKILL); -1 when it had to be killed.
int wait_exit(pid_t pid, std::chrono::seconds limit) {
  int status = 0;
  auto deadline = Clock::now() + limit;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return status;
}

// Polls `cond` every 20 ms for at most `limit`.
template <class F>
bool eventually(F cond, std::chrono::seconds limit) {
  auto deadline = Clock::now() + limit;
  while (!cond()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

int free_port() {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(s);
  return ntohs(a.sin_port);
}

// A worker that starts a `sleep` grandchild in its group, writes its pid to DIR/gc_RANK and
// waits; `trap` is sh text run first (e.g. a SIGTERM trap).
std::vector<std::string> sleeper(const fs::path& d, const std::string& trap = "") {
  return {"sh", "-c",
          trap + "sleep 1000 & echo $! > " + d.string() + "/gc_$RANK.tmp; mv " + d.string() +
              "/gc_$RANK.tmp " + d.string() + "/gc_$RANK; wait"};
}

// Waits until both workers of `agent` run and wrote their grandchild's pid; fills `r`.
bool wait_sleepers(pid_t agent, const fs::path& d, Reaper& r, std::vector<pid_t>& workers,
                   std::vector<pid_t>& grandchildren) {
  bool ok = eventually(
      [&] {
        return fs::exists(d / "gc_0") && fs::exists(d / "gc_1") && worker_child(agent, 0) > 0 &&
               worker_child(agent, 1) > 0;
      },
      std::chrono::seconds(30));
  if (!ok) return false;
  for (int rank : {0, 1}) {
    workers.push_back(worker_child(agent, rank));
    grandchildren.push_back(pid_t(std::stoi(read_all(d / ("gc_" + std::to_string(rank))))));
  }
  r.pids.insert(workers.begin(), workers.end());
  r.pids.insert(grandchildren.begin(), grandchildren.end());
  return true;
}

std::vector<std::string> run_args(std::vector<std::string> own,
                                  const std::vector<std::string>& cmd) {
  std::vector<std::string> a = {"run", "--standalone", "--nproc-per-node", "2"};
  a.insert(a.end(), own.begin(), own.end());
  a.push_back("--");
  a.insert(a.end(), cmd.begin(), cmd.end());
  return a;
}

TEST(Supervision, SigkillOfTheAgentTakesWorkersAndGrandchildrenAndFreesThePort) {
  fs::path d = temp_dir("sigkill");
  std::string port = std::to_string(free_port());
  Reaper r;
  r.agent = weft::test::start_weft(run_args({"--store-port", port}, sleeper(d)), d / "out.txt");
  std::vector<pid_t> workers, gc;
  ASSERT_TRUE(wait_sleepers(r.agent, d, r, workers, gc)) << read_all(d / "out.txt");
  auto t0 = Clock::now();
  ::kill(r.agent, SIGKILL);
  ::waitpid(r.agent, nullptr, 0);
  r.agent = -1;
  bool gone = eventually(
      [&] {
        for (pid_t p : r.pids)
          if (alive(p)) return false;
        return true;
      },
      std::chrono::seconds(10));
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_TRUE(gone) << "a worker or grandchild outlived weft run";
  std::printf("[ measure  ] SIGKILL of weft run -> last worker/grandchild gone: %.3f s\n", secs);
  // The store's port is free again: a relaunch on it works.
  CommandResult again = run_weft("run --standalone --nproc-per-node 2 --store-port " + port +
                                 " -- sh -c 'echo again $RANK'");
  EXPECT_EQ(again.code, 0) << again.out;
  EXPECT_NE(again.out.find("[rank 1] again 1"), std::string::npos) << again.out;
  fs::remove_all(d);
}

TEST(Supervision, SigtermAndSighupStopTheWorkersWithinGrace) {
  for (int sig : {SIGTERM, SIGHUP}) {
    SCOPED_TRACE(sig == SIGTERM ? "SIGTERM" : "SIGHUP");
    fs::path d = temp_dir(sig == SIGTERM ? "term" : "hup");
    Reaper r;
    r.agent = weft::test::start_weft(
        run_args({"--grace", "20"}, sleeper(d, "trap 'echo got SIGTERM; kill $!; exit 0' TERM; ")),
        d / "out.txt");
    std::vector<pid_t> workers, gc;
    ASSERT_TRUE(wait_sleepers(r.agent, d, r, workers, gc)) << read_all(d / "out.txt");
    ::kill(r.agent, sig);
    int status = wait_exit(r.agent, std::chrono::seconds(60));
    r.agent = -1;
    std::string out = read_all(d / "out.txt");
    ASSERT_TRUE(status >= 0 && WIFEXITED(status)) << out;
    EXPECT_EQ(WEXITSTATUS(status), 128 + sig) << out;
    EXPECT_NE(out.find("[rank 0] got SIGTERM"), std::string::npos) << out;
    EXPECT_NE(out.find("[rank 1] got SIGTERM"), std::string::npos) << out;
    EXPECT_EQ(out.find("root cause"), std::string::npos) << out;  // a stop, not a failure
    for (pid_t p : r.pids) EXPECT_FALSE(alive(p)) << p;
    fs::remove_all(d);
  }
}

TEST(Supervision, WorkersThatIgnoreSigtermGetSigkillAfterGrace) {
  fs::path d = temp_dir("ignore");
  Reaper r;
  r.agent = weft::test::start_weft(run_args({"--grace", "1"}, sleeper(d, "trap '' TERM; ")),
                                   d / "out.txt");
  std::vector<pid_t> workers, gc;
  ASSERT_TRUE(wait_sleepers(r.agent, d, r, workers, gc)) << read_all(d / "out.txt");
  ::kill(r.agent, SIGTERM);
  int status = wait_exit(r.agent, std::chrono::seconds(60));
  r.agent = -1;
  std::string out = read_all(d / "out.txt");
  ASSERT_TRUE(status >= 0 && WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 143) << out;
  for (pid_t p : r.pids) EXPECT_FALSE(alive(p)) << p;
  fs::remove_all(d);
}

// Two dp workers train "forever"; rank 1 is stopped. The collective timeout is 120 s and the
// test gives the job 90 s: only the heartbeat can end it, naming rank 1 and its pid.
TEST(Supervision, StoppedWorkerIsNamedByItsMissingHeartbeat) {
  fs::path d = temp_dir("sigstop");
  Reaper r;
  r.agent = weft::test::start_weft(
      run_args({"--worker-heartbeat-timeout", "3", "--grace", "2"},
               {"weft", "train", "--config", kConfig, "--set", "parallel.dp=2", "--set",
                "train.steps=100000", "--set", "train.log_every=1", "--set",
                "train.out_dir=" + (d / "run").string()}),
      d / "out.txt", {"WEFT_COMM_TIMEOUT_MS=120000"});
  pid_t victim = -1;
  ASSERT_TRUE(eventually(
      [&] {
        victim = worker_child(r.agent, 1);
        return victim > 0 && read_all(d / "out.txt").find("| loss") != std::string::npos;
      },
      std::chrono::seconds(120)))
      << read_all(d / "out.txt");
  r.pids.insert(victim);
  r.pids.insert(worker_child(r.agent, 0));
  auto t0 = Clock::now();
  ::kill(victim, SIGSTOP);
  int status = wait_exit(r.agent, std::chrono::seconds(90));
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  r.agent = -1;
  std::string out = read_all(d / "out.txt");
  ASSERT_GE(status, 0) << "weft run did not notice the stopped worker\n" << out;
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 1) << out;
  std::string named = "rank 1 (pid " + std::to_string(victim) + ") sent no heartbeat for ";
  EXPECT_NE(out.find(named), std::string::npos) << out;
  EXPECT_NE(out.find("root cause: rank 1 (pid " + std::to_string(victim)), std::string::npos)
      << out;
  EXPECT_EQ(out.find("rank 0 (pid"), std::string::npos) << out;
  std::printf("[ measure  ] SIGSTOP of rank 1 -> weft run exited: %.3f s (heartbeat 1 s / 3 s)\n",
              secs);
  for (pid_t p : r.pids) EXPECT_FALSE(alive(p)) << p;
  fs::remove_all(d);
}

// Rank 1 fails on its own (a weights file that does not exist, after the world connected);
// rank 0 then loses its peer. The summary names rank 1 and its error, not rank 0.
TEST(Supervision, RootCauseIsTheRankThatFailedFirst) {
  fs::path d = temp_dir("root");
  std::string train =
      kWeft + " train --config " + kConfig +
      " --set parallel.dp=2 --set train.steps=100000 --set train.out_dir=" + (d / "run").string();
  Reaper r;
  r.agent = weft::test::start_weft(
      run_args({"--log-dir", (d / "logs").string()},
               {"sh", "-c",
                "if [ $RANK = 1 ]; then exec " + train + " --init-weights " +
                    (d / "missing.safetensors").string() + "; else exec " + train + "; fi"}),
      d / "out.txt");
  int status = wait_exit(r.agent, std::chrono::seconds(120));
  r.agent = -1;
  std::string out = read_all(d / "out.txt");
  ASSERT_TRUE(status >= 0 && WIFEXITED(status)) << out;
  EXPECT_NE(WEXITSTATUS(status), 0) << out;
  size_t at = out.find("weft run: root cause: rank 1 (pid ");
  ASSERT_NE(at, std::string::npos) << out;
  std::string line = out.substr(at, out.find('\n', at) - at);
  EXPECT_NE(line.find("missing.safetensors"), std::string::npos) << line;
  EXPECT_NE(line.find("failed first at "), std::string::npos) << line;
  // The error file torchrun's way: JSON with the message and a timestamp.
  std::string json = read_all(d / "logs" / "attempt_0" / "rank_1" / "error.json");
  EXPECT_NE(json.find("\"message\": {\"message\": "), std::string::npos) << json;
  EXPECT_NE(json.find("\"timestamp\": "), std::string::npos) << json;
  fs::remove_all(d);
}

// A rank that recorded its error first may still be exiting (a sanitizer's teardown is slow)
// when its peer's exit makes weft run stop the job: the root cause is still that rank, and
// the exit code its own (2: bad input), not 1 for the SIGTERM it got while exiting.
TEST(Supervision, RootCauseStoppedWhileExitingKeepsItsOwnExitCode) {
  fs::path d = temp_dir("exiting");
  const std::string record =
      "printf '{\"message\": {\"message\": \"model: too big\", \"extraInfo\": "
      "{\"timestamp_ms\": 1000, \"kind\": \"config\", \"rank\": 0}}}' > "
      "\"$TORCHELASTIC_ERROR_FILE\"";
  Reaper r;
  r.agent = weft::test::start_weft(
      run_args({"--grace", "1"},
               {"sh", "-c",
                "if [ $RANK = 0 ]; then " + record + "; sleep 30; else sleep 0.3; exit 2; fi"}),
      d / "out.txt");
  int status = wait_exit(r.agent, std::chrono::seconds(60));
  r.agent = -1;
  std::string out = read_all(d / "out.txt");
  ASSERT_TRUE(status >= 0 && WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 2) << out;
  EXPECT_NE(out.find("weft run: root cause: rank 0 "), std::string::npos) << out;
  EXPECT_NE(out.find("model: too big"), std::string::npos) << out;
  fs::remove_all(d);
}

TEST(Supervision, LogDirRedirectsTeeAndRanksFilter) {
  fs::path d = temp_dir("logs");
  const std::string cmd = " -- sh -c 'echo out$RANK; echo err$RANK >&2'";
  auto file = [&](const std::string& dir, int rank, const char* stream) {
    return read_all(d / dir / "attempt_0" / ("rank_" + std::to_string(rank)) / stream);
  };
  // --log-dir alone: both streams in the files and on the console.
  CommandResult a =
      run_weft("run --standalone --nproc-per-node 2 --log-dir " + (d / "a").string() + cmd);
  ASSERT_EQ(a.code, 0) << a.out;
  EXPECT_EQ(file("a", 1, "stdout.log"), "out1\n");
  EXPECT_EQ(file("a", 1, "stderr.log"), "err1\n");
  EXPECT_NE(a.out.find("[rank 1] out1"), std::string::npos) << a.out;
  EXPECT_NE(a.out.find("[rank 1] err1"), std::string::npos) << a.out;
  // -r 1 -t 2: stdout only in the file, stderr in both.
  CommandResult b = run_weft("run --standalone --nproc-per-node 2 -r 1 -t 2 --log-dir " +
                             (d / "b").string() + cmd);
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_EQ(file("b", 0, "stdout.log"), "out0\n");
  EXPECT_EQ(file("b", 0, "stderr.log"), "err0\n");
  EXPECT_EQ(b.out.find("out0"), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("[rank 0] err0"), std::string::npos) << b.out;
  // Per rank: rank 0 redirects both, rank 1 nothing; the console shows rank 1 only.
  CommandResult c = run_weft(
      "run --standalone --nproc-per-node 2 --redirects 0:3 "
      "--local-ranks-filter 1 --log-dir " +
      (d / "c").string() + cmd);
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_EQ(file("c", 0, "stdout.log"), "out0\n");
  EXPECT_FALSE(fs::exists(d / "c" / "attempt_0" / "rank_1" / "stdout.log"));
  EXPECT_EQ(c.out.find("[rank 0]"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("[rank 1] out1"), std::string::npos) << c.out;
  // A malformed spec names the flag.
  CommandResult bad = run_weft("run --standalone --nproc-per-node 2 --redirects 7" + cmd);
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("--redirects"), std::string::npos) << bad.out;
  fs::remove_all(d);
}

TEST(Supervision, WorkersSeeTorchrunsVariables) {
  CommandResult r = run_weft("run --standalone --nproc-per-node 2 --role trainer --no-python -- sh -c env");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* kv :
       {"[rank 1] RANK=1", "[rank 1] LOCAL_RANK=1", "[rank 1] WORLD_SIZE=2",
        "[rank 1] LOCAL_WORLD_SIZE=2", "[rank 1] GROUP_RANK=0", "[rank 1] GROUP_WORLD_SIZE=1",
        "[rank 1] ROLE_RANK=1", "[rank 1] ROLE_WORLD_SIZE=2", "[rank 1] MASTER_ADDR=127.0.0.1",
        "[rank 1] MASTER_PORT=", "[rank 1] TORCHELASTIC_RUN_ID=",
        "[rank 1] TORCHELASTIC_RESTART_COUNT=0", "[rank 1] TORCHELASTIC_MAX_RESTARTS=0",
        "[rank 1] TORCHELASTIC_ERROR_FILE=", "[rank 1] WEFT_RANK=1", "[rank 1] WEFT_STORE_ADDR=",
        "[rank 1] ROLE_NAME=trainer"})
    EXPECT_NE(r.out.find(kv), std::string::npos) << kv << "\n" << r.out;
  // MASTER_PORT is the store's port.
  size_t at = r.out.find("[rank 1] MASTER_PORT=");
  std::string port = r.out.substr(at + 21, r.out.find('\n', at) - at - 21);
  EXPECT_NE(r.out.find("[rank 1] WEFT_STORE_ADDR=127.0.0.1:" + port + "\n"), std::string::npos)
      << r.out;
}

// --max-restarts on one machine, workers that do not follow epoch notices (a shell): the
// one-node agent restarts every worker in the next round (the next attempt sees
// TORCHELASTIC_RESTART_COUNT=1, its own store keys and its own log folder); restarts used up
// end the job with the last attempt's root cause and exit code.
TEST(Supervision, StandaloneRestartsFailedAttemptsUpToMaxRestarts) {
  fs::path d = temp_dir("restarts");
  const std::string worker =
      "sh -c 'echo attempt $TORCHELASTIC_RESTART_COUNT of $TORCHELASTIC_MAX_RESTARTS prefix "
      "[$WEFT_STORE_PREFIX]; if [ $TORCHELASTIC_RESTART_COUNT = 0 ] && [ $RANK = 1 ]; then "
      "exit 3; fi'";
  CommandResult r = run_weft("run --standalone --nproc-per-node 2 --max-restarts 2 --monitor-interval 0.05 --log-dir " +
                             d.string() + " --tee 3 -- " + worker);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("restarting the workers (1 of --max-restarts 2 used)"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("[rank 1] attempt 1 of 2 prefix [rdzv/"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("/epoch/1/round/1]"), std::string::npos) << r.out;
  EXPECT_NE(read_all(d / "attempt_0" / "rank_1" / "stdout.log").find("attempt 0"), std::string::npos);
  EXPECT_NE(read_all(d / "attempt_1" / "rank_1" / "stdout.log").find("attempt 1"), std::string::npos);

  CommandResult out = run_weft("run --standalone --nproc-per-node 2 --max-restarts 1 -- sh -c 'exit 4'");
  EXPECT_EQ(out.code, 4) << out.out;
  size_t first = out.out.find("restarting the workers (1 of --max-restarts 1 used)");
  EXPECT_NE(first, std::string::npos) << out.out;
  EXPECT_EQ(out.out.find("restarting the workers", first + 1), std::string::npos) << out.out;
  EXPECT_NE(out.out.find("weft run: failed: rank "), std::string::npos) << out.out;
  fs::remove_all(d);
}

// A `weft train` wrapped in a shell under --standalone --max-restarts 1 (dp2): in attempt 0
// rank 1's shell kills its trainer once step 30's checkpoint exists and exits 5. Returns the
// run's output after checking that it succeeded with a single process's losses.
std::string wrapped_trainer_fails_once(const std::string& name, const std::string& on_change) {
  fs::path d = temp_dir(name);
  const int steps = 60;
  const std::string train = kWeft + " train --config " + kConfig + " --set train.steps=" +
                            std::to_string(steps) +
                            " --set train.warmup_steps=1 --set train.log_every=1"
                            " --set train.eval_every=1000000";
  CommandResult one = run_command(train + " --set parallel.dp=1 --set train.out_dir=" +
                                  (d / "one").string());
  EXPECT_EQ(one.code, 0) << one.out;
  const std::string cmd = train + " --set parallel.dp=2 --set train.out_dir=" +
                          (d / "two").string() + " --set checkpoint.dir=" + (d / "ckpt").string() +
                          " --set checkpoint.every=10 --set checkpoint.async=false" +
                          (on_change.empty() ? "" : " --set elastic.on_change=" + on_change);
  const std::string worker =
      "if [ $TORCHELASTIC_RESTART_COUNT = 0 ] && [ $RANK = 1 ]; then " + cmd + " & t=$!; " +
      "while [ ! -d " + (d / "ckpt" / "step-00000030").string() +
      " ]; do sleep 0.02; done; kill -9 $t; exit 5; fi; exec " + cmd;
  CommandResult r = run_weft("run --standalone --nproc-per-node 2 --max-restarts 1 -- sh -c '" +
                             worker + "'");
  EXPECT_EQ(r.code, 0) << r.out;
  if (r.code == 0)
    test::expect_same_losses(d / "one" / "metrics.jsonl", d / "two" / "metrics.jsonl", steps,
                             /*validation=*/false, 2e-7);
  if (!::testing::Test::HasFailure()) fs::remove_all(d);
  return r.out;
}

// Under the default elastic.on_change (reshard) the workers follow epoch notices, whatever
// command starts them: the agent learns it from the workers (not from the command line), so
// the wrapped trainer is replaced in place like a bare `weft train`, rank 0 keeps training.
TEST(Supervision, StandaloneWrappedTrainerUnderTheDefaultOnChangeIsReplacedInPlace) {
  const std::string out = wrapped_trainer_fails_once("train_replace", "");
  EXPECT_NE(out.find("exited with code 5; replaced in place (1 of --max-restarts 1 used)"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("restarting the workers"), std::string::npos) << out;
  EXPECT_NE(out.find("resize: epoch 1 -> 2"), std::string::npos) << out;
}

// elastic.on_change: restart: workers that do not follow notices restart every worker from
// the latest checkpoint in the agent's next round.
TEST(Supervision, StandaloneWrappedTrainerUnderOnChangeRestartRestartsFromTheLatestCheckpoint) {
  const std::string out = wrapped_trainer_fails_once("train_restart", "restart");
  EXPECT_NE(out.find("restarting the workers (1 of --max-restarts 1 used)"), std::string::npos)
      << out;
  EXPECT_NE(out.find("weft train: restart 1 ("), std::string::npos) << out;
  EXPECT_NE(out.find("resuming from the latest checkpoint under"), std::string::npos) << out;
  EXPECT_EQ(out.find("resize:"), std::string::npos) << out;  // nothing resharded live
}

}  // namespace
}  // namespace weft::test
