// The node's snapshot agent as real processes (issue 15): `weft snapshot-agent` reserving,
// adopting after a kill -9, refusing what does not fit, retiring an older epoch, finishing,
// removing an abandoned job's segments (not while the guardian that restarts a killed agent
// lives), a stopped agent timing its client out; and weft run starting, restarting,
// finishing and stopping it, and another job's agent starting while weft run restarts one.
// Each test has its own job ids; the fixture (snapshot_fixture.h) kills and reaps every
// process it started and unlinks every segment of its jobs however the test ends.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/error.h"
#include "checkpoint/job_id.h"
#include "checkpoint/snapshot_protocol.h"
#include "checkpoint/snapshot_segment.h"
#include "tests/scenario/snapshot_fixture.h"

namespace weft::checkpoint {
namespace {

constexpr int64_t kRankBytes = (int64_t(1) << 20) + 4096;  // two crc blocks, the last short

// One agent for node 0 at socket_ (the processes, jobs and segments: SnapshotProcessTest).
class SnapshotAgentTest : public SnapshotProcessTest {
 protected:
  void SetUp() override {
    SnapshotProcessTest::SetUp();
    socket_ = path("agent.sock");
  }
  pid_t start_agent(const std::string& job, const std::string& log = "",
                    const std::string& abandoned_after = "60") {
    return start({"snapshot-agent", "--job", job, "--node", "0", "--socket", socket_,
                  "--abandoned-after", abandoned_after},
                 log.empty() ? path("agent.log") : log);
  }
  // A process that only waits (a stand-in for a weft run), killed and reaped by TearDown.
  pid_t start_sleeper() {
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      for (;;) ::pause();
    }
    pids_.push_back(pid);
    return pid;
  }
  // Waits until segment `name` is at least `seconds` whole seconds old by the clock an
  // agent's --abandoned-after reads (its ctime), so that the agent judges it.
  static void wait_older_than(const std::string& name, int seconds) {
    struct stat st {};
    ASSERT_EQ(::stat(("/dev/shm" + name).c_str(), &st), 0) << name;
    while (::time(nullptr) - st.st_ctime < seconds) std::this_thread::sleep_for(milliseconds(50));
  }
  // Polls until the owner recorded in segment `name` is gone (dead, or a zombie nobody reaped).
  static bool wait_owner_gone(const std::string& name) {
    const auto until = Clock::now() + milliseconds(20000);
    while (!SnapshotSegment::open(name, false).owner_gone()) {
      if (Clock::now() > until) return false;
      std::this_thread::sleep_for(milliseconds(10));
    }
    return true;
  }
  Reservation two_ranks(const std::string& job, int64_t epoch) const {
    return Reservation{job, 0, epoch, {{0, 2, kRankBytes}, {1, 2, kRankBytes}}, 0};
  }

  std::string socket_;
};

// Reserve for two ranks, a committed snapshot in one, kill -9 of the agent: a restarted
// agent adopts both segments (it becomes their owner) and lists the same step, data intact.
TEST_F(SnapshotAgentTest, KillNineThenRestartedAgentAdoptsTheCommittedSnapshot) {
  pid_t agent = start_agent(job_);
  SnapshotAgentClient client(milliseconds(10000));
  client.connect(socket_);
  std::vector<std::string> names = client.segment(two_ranks(job_, 1));
  ASSERT_EQ(names.size(), 2u);
  EXPECT_EQ(names[0], segment_name(job_, SegmentKind::kData, 0, 1, 0));
  EXPECT_EQ(names, client.segment(two_ranks(job_, 1)));  // idempotent
  write_snapshot(names[0], job_, 0, 1, 0, 2, 7, kRankBytes);
  EXPECT_EQ(client.committed(names[0], 7), 7);

  std::vector<SegmentInfo> before = client.list();
  ASSERT_EQ(before.size(), 2u);
  ASSERT_TRUE(before[0].committed.has_value());
  EXPECT_EQ(before[0].committed->step, 7);
  EXPECT_EQ(before[0].owner_pid, agent);
  EXPECT_FALSE(before[1].committed.has_value());

  kill9(agent);
  SnapshotAgentClient quick(milliseconds(300));
  EXPECT_THROW(quick.connect(socket_), IoError);  // nothing serves the socket now
  pid_t again = start_agent(job_);
  std::vector<SegmentInfo> after = client.list();  // the client connects again
  ASSERT_EQ(after.size(), 2u) << read(path("agent.log"));
  ASSERT_TRUE(after[0].committed.has_value());
  EXPECT_EQ(after[0].committed->step, 7);
  EXPECT_EQ(after[0].committed->sequence, before[0].committed->sequence);
  EXPECT_EQ(after[0].owner_pid, again);  // taken over: not abandoned
  EXPECT_FALSE(after[1].committed.has_value());
  EXPECT_TRUE(holds_step(names[0], 7));
  EXPECT_NE(
      read(path("agent.log")).find("adopted " + names[0] + " (epoch 1, rank 0, committed step 7"),
      std::string::npos)
      << read(path("agent.log"));
}

// Absurd bytes: refused naming snapshot.every, the sizes, the free memory and the fix;
// nothing is created.
TEST_F(SnapshotAgentTest, ReserveThatDoesNotFitIsRefusedNamingSnapshotEvery) {
  start_agent(job_);
  SnapshotAgentClient client(milliseconds(10000));
  client.connect(socket_);
  Reservation r{job_, 0, 1, {{0, 2, int64_t(1) << 44}, {1, 2, int64_t(1) << 44}}, 0};
  try {
    client.segment(r);
    FAIL() << "a reserve of 2 x 16 TiB fit";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.field(), "snapshot.every");
    EXPECT_NE(msg.find("16.00 TiB"), std::string::npos) << msg;  // each rank's size
    EXPECT_NE(msg.find("64.00 TiB"), std::string::npos) << msg;  // what it needs
    EXPECT_NE(msg.find("MemAvailable"), std::string::npos) << msg;
    EXPECT_NE(msg.find("/dev/shm free"), std::string::npos) << msg;
    EXPECT_NE(msg.find("snapshot.every: 0"), std::string::npos) << msg;
  }
  EXPECT_TRUE(snapshot_segments(job_).empty());
  EXPECT_EQ(client.segment(two_ranks(job_, 1)).size(), 2u);  // the agent serves on
}

// Epoch 2 (a resize) reserves its own segments; epoch 1's stay until every segment of
// epoch 2 here has committed, then go: the node always holds one complete snapshot.
TEST_F(SnapshotAgentTest, NewerEpochCommitRetiresTheOlderEpochOnceComplete) {
  start_agent(job_);
  SnapshotAgentClient client(milliseconds(10000));
  client.connect(socket_);
  std::vector<std::string> old_names = client.segment(two_ranks(job_, 1));
  for (int r = 0; r < 2; ++r) {
    write_snapshot(old_names[size_t(r)], job_, 0, 1, r, 2, 10, kRankBytes);
    client.committed(old_names[size_t(r)], 10);
  }
  std::vector<std::string> new_names = client.segment(two_ranks(job_, 2));
  write_snapshot(new_names[0], job_, 0, 2, 0, 2, 12, kRankBytes);
  client.committed(new_names[0], 12);
  EXPECT_TRUE(exists(old_names[0]) && exists(old_names[1])) << "epoch 2 is not complete yet";
  EXPECT_EQ(client.list().size(), 4u);
  write_snapshot(new_names[1], job_, 0, 2, 1, 2, 12, kRankBytes);
  client.committed(new_names[1], 12);
  EXPECT_FALSE(exists(old_names[0]));
  EXPECT_FALSE(exists(old_names[1]));
  std::vector<SegmentInfo> now = client.list();
  ASSERT_EQ(now.size(), 2u);
  for (const SegmentInfo& s : now) EXPECT_EQ(s.epoch, 2);
  EXPECT_NE(read(path("agent.log")).find("superseded by epoch 2"), std::string::npos);
}

// finish: every segment of the job goes, the agent answers and exits 0, its socket and
// lock with it.
TEST_F(SnapshotAgentTest, FinishRemovesEverySegmentAndTheAgentExitsZero) {
  pid_t agent = start_agent(job_);
  SnapshotAgentClient client(milliseconds(10000));
  client.connect(socket_);
  std::vector<std::string> names = client.segment(two_ranks(job_, 3));
  write_snapshot(names[1], job_, 0, 3, 1, 2, 5, kRankBytes);
  client.committed(names[1], 5);
  std::vector<std::string> removed = client.finish(job_);
  EXPECT_EQ(removed, names);
  int status = wait_exit(agent, 10);
  ASSERT_NE(status, -1) << "the agent did not exit after finish";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_TRUE(snapshot_segments(job_).empty());
  EXPECT_FALSE(fs::exists(socket_));
  EXPECT_FALSE(fs::exists("/dev/shm/weft-agent-" + job_ + "-n0.lock"));
}

// finish of the node's scope (a node that left a job that goes on): the agent removes the
// segments it holds and exits 0; another node's agent of the job on this machine keeps its
// own. A scope other than "job" or "node" is refused, naming it.
TEST_F(SnapshotAgentTest, FinishOfTheNodesScopeRemovesOnlyThisAgentsSegments) {
  pid_t leaver = start_agent(job_);
  const std::string other_socket = path("other.sock");
  start({"snapshot-agent", "--job", job_, "--node", "1", "--socket", other_socket,
         "--abandoned-after", "60"},
        path("other.log"));
  SnapshotAgentClient mine(milliseconds(10000)), other(milliseconds(10000));
  mine.connect(socket_);
  other.connect(other_socket);
  std::vector<std::string> names = mine.segment(two_ranks(job_, 1));
  std::vector<std::string> kept =
      other.segment(Reservation{job_, 1, 1, {{0, 2, kRankBytes}, {1, 2, kRankBytes}}, 0});
  write_snapshot(kept[0], job_, 1, 1, 0, 2, 5, kRankBytes);
  other.committed(kept[0], 5);
  const nlohmann::json refused =
      mine.call({{"op", "finish"}, {"job", job_}, {"scope", "machine"}}, milliseconds(10000));
  EXPECT_FALSE(refused.value("ok", true)) << refused.dump();
  EXPECT_NE(refused.value("error", std::string()).find("\"scope\" is \"job\" or \"node\""),
            std::string::npos)
      << refused.dump();
  std::vector<std::string> removed = mine.finish(job_, /*node_only=*/true);
  EXPECT_EQ(removed, names);
  const int status = wait_exit(leaver, 10);
  ASSERT_NE(status, -1) << "the agent did not exit after finish";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_FALSE(exists(names[0]) || exists(names[1]));
  EXPECT_TRUE(exists(kept[0]) && exists(kept[1]));
  EXPECT_EQ(other.list().size(), 2u);
  EXPECT_NE(read(path("agent.log")).find("removed the 2 segment(s) this agent held"),
            std::string::npos)
      << read(path("agent.log"));
}

// SIGTERM: the agent stops serving and exits 0; the segments stay for a restart.
TEST_F(SnapshotAgentTest, SigtermKeepsTheSegmentsAndExitsZero) {
  pid_t agent = start_agent(job_);
  SnapshotAgentClient client(milliseconds(10000));
  client.connect(socket_);
  std::vector<std::string> names = client.segment(two_ranks(job_, 1));
  ::kill(agent, SIGTERM);
  int status = wait_exit(agent, 10);
  ASSERT_NE(status, -1);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_TRUE(exists(names[0]) && exists(names[1]));
  EXPECT_NE(read(path("agent.log")).find("got SIGTERM: stopping; 2 segment(s) kept"),
            std::string::npos);
}

// At start the agent removes the segments of a job whose owner is gone, and leaves a job
// whose owner lives (and its own job's segments of another node) alone.
TEST_F(SnapshotAgentTest, AbandonedJobsSegmentsAreRemovedAtStart) {
  pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);  // its pid now names no process
  const std::string abandoned = job(), alive = job();
  const std::string a = segment_name(abandoned, SegmentKind::kData, 0, 1, 0);
  const std::string b = segment_name(alive, SegmentKind::kData, 0, 1, 0);
  const std::string other_node = segment_name(job_, SegmentKind::kData, 1, 1, 0);
  SnapshotSegment::create(a, 4096, int(dead));
  SnapshotSegment::create(b, 4096, int(::getpid()));
  SnapshotSegment::create(other_node, 4096, int(dead));
  // Younger than --abandoned-after: not judged (a tool may be about to hand it over).
  const pid_t young = start_agent(job_, path("young.log"));
  {
    SnapshotAgentClient early(milliseconds(10000));
    early.connect(socket_);
    EXPECT_TRUE(exists(a));
  }
  ::kill(young, SIGTERM);  // keeps every segment
  EXPECT_NE(wait_exit(young, 10), -1);
  std::this_thread::sleep_for(milliseconds(1100));
  start_agent(job_, "", "1");
  SnapshotAgentClient client(milliseconds(10000));
  client.connect(socket_);  // the agent cleans before it listens
  EXPECT_FALSE(exists(a));
  EXPECT_TRUE(exists(b));
  EXPECT_TRUE(exists(other_node));
  EXPECT_TRUE(client.list().empty());  // node 1's segment is not node 0's to adopt
  EXPECT_NE(read(path("agent.log")).find("removed " + a + ": abandoned"), std::string::npos)
      << read(path("agent.log"));
}

// A killed agent's segments are kept by another job's agent while the agent's guardian (here
// a stand-in for weft run) lives, and removed by the next one once the guardian is gone too.
TEST_F(SnapshotAgentTest, ADeadAgentsSegmentsAreAbandonedOnlyOnceItsGuardianIsGoneToo) {
  const pid_t guardian = start_sleeper();
  const pid_t agent = start({"snapshot-agent", "--job", job_, "--node", "0", "--socket", socket_,
                             "--guardian", std::to_string(guardian)},
                            path("agent.log"));
  SnapshotAgentClient client(milliseconds(10000));
  client.connect(socket_);
  const std::vector<std::string> names = client.segment(two_ranks(job_, 1));
  write_snapshot(names[0], job_, 0, 1, 0, 2, 6, kRankBytes);
  client.committed(names[0], 6);
  EXPECT_EQ(SnapshotSegment::open(names[0], false).guardian_pid(), guardian);
  kill9(agent);
  wait_older_than(names[0], 1);

  auto other_agent = [&](const std::string& log) {
    const pid_t a = start({"snapshot-agent", "--job", job(), "--node", "0", "--socket",
                           path("other.sock"), "--abandoned-after", "1"},
                          path(log));
    SnapshotAgentClient c(milliseconds(10000));
    c.connect(path("other.sock"));  // it judges other jobs' segments before it listens
    ::kill(a, SIGTERM);
    EXPECT_NE(wait_exit(a, 10), -1);
  };
  other_agent("kept.log");
  EXPECT_TRUE(exists(names[0]) && exists(names[1]));
  EXPECT_NE(read(path("kept.log"))
                .find("kept " + names[0] + " of job " + job_ + ": its owner, pid " +
                      std::to_string(agent) + ", is gone but its guardian, pid " +
                      std::to_string(guardian) + ", lives"),
            std::string::npos)
      << read(path("kept.log"));

  ::kill(guardian, SIGKILL);
  EXPECT_NE(wait_exit(guardian, 10), -1);
  other_agent("removed.log");
  EXPECT_FALSE(exists(names[0]));
  EXPECT_FALSE(exists(names[1]));
  EXPECT_NE(read(path("removed.log"))
                .find("removed " + names[0] + ": abandoned (job " + job_ + ": its owner, pid " +
                      std::to_string(agent) + ", and its guardian, pid " +
                      std::to_string(guardian) + ", are gone)"),
            std::string::npos)
      << read(path("removed.log"));
}

// weft run restarts its agent with the node index it first had, and a resize renumbers the
// nodes: a survivor's snapshots of the new epoch are named by its new index. The restarted
// agent still adopts them (their guardian is its guardian) and lists them, so that a new
// world restores them from this node's shared memory instead of fetching a replica or
// rebuilding them from parity. Another node's segment on this machine (another live
// guardian) is left to that node's agent.
TEST_F(SnapshotAgentTest, ARestartedAgentAdoptsItsSnapshotsNamedByALaterNodeIndex) {
  const std::vector<std::string> args = {"snapshot-agent", "--job", job_, "--node", "2",
                                         "--socket",       socket_};  // guardian: this process
  const pid_t agent = start(args, path("agent.log"));
  SnapshotAgentClient client(milliseconds(10000));
  client.connect(socket_);
  const std::vector<std::string> e1 =
      client.segment(Reservation{job_, 2, 1, {{4, 6, kRankBytes}, {5, 6, kRankBytes}}, 0});
  for (int l = 0; l < 2; ++l) {
    write_snapshot(e1[size_t(l)], job_, 2, 1, 4 + l, 6, 4, kRankBytes);
    client.committed(e1[size_t(l)], 4);
  }
  // Epoch 2: node 1 of epoch 1 is gone; this node is node 1 now, its ranks 2 and 3 of 4.
  const std::vector<std::string> e2 =
      client.segment(Reservation{job_, 1, 2, {{2, 4, kRankBytes}, {3, 4, kRankBytes}}, 0});
  EXPECT_EQ(e2[0], segment_name(job_, SegmentKind::kData, 1, 2, 2));
  for (int l = 0; l < 2; ++l) {
    write_snapshot(e2[size_t(l)], job_, 1, 2, 2 + l, 4, 6, kRankBytes);
    client.committed(e2[size_t(l)], 6);
  }
  EXPECT_FALSE(exists(e1[0])) << "epoch 1 retired once epoch 2 is complete here";
  const pid_t other_run = start_sleeper();
  const std::string theirs = segment_name(job_, SegmentKind::kData, 0, 2, 0);
  { SnapshotSegment::create(theirs, 4096, int(agent), kMinSnapshotSlots, int(other_run)); }

  kill9(agent);
  const pid_t again = start(args, path("agent.log"));
  std::vector<SegmentInfo> listed = client.list();  // the client connects again
  ASSERT_EQ(listed.size(), 2u) << read(path("agent.log"));
  for (int l = 0; l < 2; ++l) {
    const SegmentInfo& s = listed[size_t(l)];
    EXPECT_EQ(s.name, e2[size_t(l)]);
    ASSERT_TRUE(s.committed.has_value()) << s.name;
    EXPECT_EQ(s.committed->step, 6);
    EXPECT_EQ(s.committed->kind, SegmentKind::kData) << "this node's own snapshot";
    EXPECT_EQ(s.owner_pid, again);
    EXPECT_TRUE(holds_step(s.name, 6));
  }
  EXPECT_NE(read(path("agent.log"))
                .find("adopted " + e2[0] + " (epoch 2, rank 2, committed step 6, left by pid " +
                      std::to_string(agent) +
                      "; this node's as node 1 of epoch 2, by its "
                      "guardian pid " +
                      std::to_string(::getpid()) + ")"),
            std::string::npos)
      << read(path("agent.log"));
  EXPECT_EQ(SnapshotSegment::open(theirs, false).owner_pid(), agent) << "another node's: left";
}

// A stopped (hung) agent: the call fails with IoError after its timeout instead of
// hanging; once the agent runs again the next call connects anew and succeeds.
TEST_F(SnapshotAgentTest, CallToAStoppedAgentTimesOutWithIoError) {
  pid_t agent = start_agent(job_);
  {
    // The agent may take more than the short timeout to start listening on a busy machine
    // (the suite's 2 cores): wait for it with a patient client first.
    SnapshotAgentClient ready(milliseconds(10000));
    ready.connect(socket_);
  }
  SnapshotAgentClient client(milliseconds(300), milliseconds(300));
  client.connect(socket_);
  EXPECT_TRUE(client.list().empty());
  ::kill(agent, SIGSTOP);
  const auto t0 = Clock::now();
  EXPECT_THROW(client.list(), IoError);
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_GE(took, 0.25);
  EXPECT_LT(took, 3.0);
  EXPECT_THROW(client.segment(two_ranks(job_, 1)), IoError) << "a reserve times out too";
  ::kill(agent, SIGCONT);
  SnapshotAgentClient patient(milliseconds(10000));
  patient.connect(socket_);
  EXPECT_NO_THROW(client.list());
}

// `repair` is the parity's (snapshot.redundancy ec): an agent without it refuses the request
// saying so, whatever the request holds.
TEST_F(SnapshotAgentTest, RepairWithoutParityIsRefusedSayingSo) {
  start_agent(job_);
  SnapshotAgentClient client(milliseconds(10000));
  client.connect(socket_);
  const std::vector<std::string> segs = client.segment(two_ranks(job_, 1));
  try {
    client.repair(segs[0], 1);
    ADD_FAILURE() << "a repair by an agent without parity was not refused";
  } catch (const IoError& e) {
    EXPECT_NE(
        std::string(e.what()).find("this agent keeps no parity (snapshot.redundancy is not ec)"),
        std::string::npos)
        << e.what();
  }
  const nlohmann::json bad =
      client.call({{"op", "repair"}, {"segment", segs[0]}}, milliseconds(10000));
  EXPECT_FALSE(bad.value("ok", true));
  EXPECT_NE(bad.value("error", std::string()).find("no parity"), std::string::npos) << bad.dump();
}

// A second agent for the same job and node refuses to start (exit 1), naming the first, and
// leaves the first one's lock alone.
TEST_F(SnapshotAgentTest, SecondAgentForTheSameJobAndNodeRefusesToStart) {
  start_agent(job_);
  SnapshotAgentClient client(milliseconds(10000));
  client.connect(socket_);
  pid_t second =
      start({"snapshot-agent", "--job", job_, "--node", "0", "--socket", path("other.sock")},
            path("second.log"));
  int status = wait_exit(second, 10);
  ASSERT_NE(status, -1);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << read(path("second.log"));
  EXPECT_NE(read(path("second.log")).find("another agent serves job " + job_), std::string::npos)
      << read(path("second.log"));
  EXPECT_TRUE(client.list().empty());
  EXPECT_TRUE(fs::exists("/dev/shm/weft-agent-" + job_ + "-n0.lock"))
      << "the refused agent removed the lock the first one holds";
}

// ---- weft run ----------------------------------------------------------------------------

// weft run with a stand-in worker: a script named weft (so that `weft train --config X`
// with snapshot.every set gets an agent) that records WEFT_SNAPSHOT_SOCKET and exits with
// the code written into the file `go`.
class SnapshotAgentRun : public SnapshotAgentTest {
 protected:
  void SetUp() override {
    SnapshotAgentTest::SetUp();
    fs::create_directories(dir_ / "bin");
    std::ofstream(path("bin/weft"))
        << "#!/bin/sh\n"
        << "echo \"$WEFT_SNAPSHOT_SOCKET\" > " << path("socket.tmp") << "\n"
        << "mv " << path("socket.tmp") << " " << path("socket") << "\n"
        << "while [ ! -s " << path("go") << " ]; do sleep 0.05; done\n"
        << "exit $(cat " << path("go") << ")\n";
    fs::permissions(path("bin/weft"), fs::perms::owner_all);
    run_id_ = "snapagent-" + job_;
    run_job_ = job_id_for_run(run_id_);
    jobs_.push_back(run_job_);
  }
  pid_t start_run() {
    return start(
        {"run", "--standalone", "--nproc-per-node", "1", "--rdzv-id", run_id_, "--monitor-interval",
         "0.05", "--", path("bin/weft"), "train", "--config",
         std::string(WEFT_SOURCE_DIR) + "/configs/gpt-tiny.yaml", "--set", "snapshot.every=5"},
        path("run.log"));
  }
  std::string worker_socket() {
    const auto until = Clock::now() + milliseconds(20000);
    while (!fs::exists(path("socket")) && Clock::now() < until)
      std::this_thread::sleep_for(milliseconds(20));
    std::string s = read(path("socket"));
    while (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
  void end_workers(int code) { std::ofstream(path("go")) << code << "\n"; }
  // The worker's agent (its pid, from run.log) holding one committed snapshot of `step` in
  // rank 0's segment, made through `client` (connected here to the worker's socket).
  struct Committed {
    pid_t agent = -1;
    std::string segment;
  };
  Committed commit_one(SnapshotAgentClient& client, int64_t step) {
    Committed c;
    const std::string sock = worker_socket();
    if (sock.empty()) {
      ADD_FAILURE() << "no worker socket\n" << read(path("run.log"));
      return c;
    }
    c.agent = std::stoi(wait_for(path("run.log"), R"(started the snapshot agent \(pid (\d+)\))"));
    client.connect(sock);
    c.segment = client.segment(Reservation{run_job_, 0, 1, {{0, 1, kRankBytes}}, 0}).at(0);
    write_snapshot(c.segment, run_job_, 0, 1, 0, 1, step, kRankBytes);
    client.committed(c.segment, step);
    return c;
  }
  std::string run_id_, run_job_;
};

// The agent starts beside the worker (which gets its socket); a kill -9 of the agent while
// the job runs is repaired by weft run (the new agent adopts the segment); at the job's
// successful end weft run sends finish: the segments are gone and every process reaped.
TEST_F(SnapshotAgentRun, RestartsAKilledAgentAndFinishesAtASuccessfulEnd) {
  pid_t run = start_run();
  SnapshotAgentClient client(milliseconds(10000));
  const Committed c = commit_one(client, 3);
  ASSERT_FALSE(c.segment.empty());
  EXPECT_NE(worker_socket().find(run_job_), std::string::npos) << worker_socket();
  const pid_t first = c.agent;
  const std::vector<std::string> names = {c.segment};

  ::kill(first, SIGKILL);  // weft run's child: weft run reaps it
  wait_for(path("run.log"), "restarting the snapshot agent");
  const pid_t second =
      std::stoi(wait_for(path("run.log"), R"(started the snapshot agent \(pid (\d+)\))", 2));
  EXPECT_NE(second, first);
  std::vector<SegmentInfo> listed = client.list();
  ASSERT_EQ(listed.size(), 1u) << read(path("run.log"));
  ASSERT_TRUE(listed[0].committed.has_value());
  EXPECT_EQ(listed[0].committed->step, 3);
  EXPECT_EQ(listed[0].owner_pid, second);

  end_workers(0);
  int status = wait_exit(run, 60);
  ASSERT_NE(status, -1) << read(path("run.log"));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << read(path("run.log"));
  const std::string log = read(path("run.log"));
  EXPECT_NE(log.find("the snapshot agent removed its 1 segment(s)"), std::string::npos) << log;
  EXPECT_TRUE(snapshot_segments(run_job_).empty());
  EXPECT_FALSE(fs::exists(worker_socket()));
  EXPECT_NE(::kill(first, 0), 0);
  EXPECT_NE(::kill(second, 0), 0);  // reaped by weft run, not left behind
}

// The race of a kill -9 of the agent with another job's agent starting on the node: weft
// run, the agent's guardian, is stopped so that it cannot restart the agent yet; another job's
// agent (--abandoned-after 1) starts in that window and keeps the segment (its owner is gone,
// its guardian lives); weft run, let go on, restarts the agent, which adopts the snapshot.
// Before guardians the other agent removed the segment here and the restart adopted nothing.
TEST_F(SnapshotAgentRun, AnotherJobsAgentKeepsAKilledAgentsSegmentsForItsRestart) {
  pid_t run = start_run();
  SnapshotAgentClient client(milliseconds(10000));
  const Committed c = commit_one(client, 3);
  ASSERT_FALSE(c.segment.empty());
  const pid_t first = c.agent;
  const std::vector<std::string> names = {c.segment};
  EXPECT_EQ(SnapshotSegment::open(names[0], false).guardian_pid(), run);

  ASSERT_EQ(::kill(run, SIGSTOP), 0);  // no restart until SIGCONT: the window, held open
  ::kill(first, SIGKILL);
  ASSERT_TRUE(wait_owner_gone(names[0]));  // a zombie: weft run cannot reap it while stopped
  wait_older_than(names[0], 1);
  const pid_t other = start({"snapshot-agent", "--job", job(), "--node", "0", "--socket",
                             path("other.sock"), "--abandoned-after", "1"},
                            path("other.log"));
  {
    SnapshotAgentClient c(milliseconds(10000));
    c.connect(path("other.sock"));  // it judges other jobs' segments before it listens
  }
  EXPECT_TRUE(exists(names[0])) << read(path("other.log"));
  EXPECT_NE(read(path("other.log"))
                .find("kept " + names[0] + " of job " + run_job_ + ": its owner, pid " +
                      std::to_string(first) + ", is gone but its guardian, pid " +
                      std::to_string(run) + ", lives"),
            std::string::npos)
      << read(path("other.log"));
  ::kill(other, SIGTERM);
  EXPECT_NE(wait_exit(other, 10), -1);

  ASSERT_EQ(::kill(run, SIGCONT), 0);
  wait_for(path("run.log"), "restarting the snapshot agent");
  const pid_t second =
      std::stoi(wait_for(path("run.log"), R"(started the snapshot agent \(pid (\d+)\))", 2));
  std::vector<SegmentInfo> listed = client.list();
  ASSERT_EQ(listed.size(), 1u) << read(path("run.log"));
  ASSERT_TRUE(listed[0].committed.has_value());
  EXPECT_EQ(listed[0].committed->step, 3);
  EXPECT_EQ(listed[0].owner_pid, second);
  EXPECT_TRUE(holds_step(names[0], 3));
  EXPECT_NE(read(path("run.log")).find("1 segment(s) adopted)"), std::string::npos)
      << read(path("run.log"));

  end_workers(0);
  int status = wait_exit(run, 60);
  ASSERT_NE(status, -1) << read(path("run.log"));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << read(path("run.log"));
  EXPECT_TRUE(snapshot_segments(run_job_).empty());
}

// A failed job: weft run stops the agent (SIGTERM) and the segments stay for a restart.
TEST_F(SnapshotAgentRun, StopsTheAgentAndKeepsTheSegmentsWhenTheJobFails) {
  pid_t run = start_run();
  SnapshotAgentClient client(milliseconds(10000));
  const Committed c = commit_one(client, 4);
  ASSERT_FALSE(c.segment.empty());
  const pid_t agent = c.agent;
  const std::vector<std::string> names = {c.segment};
  end_workers(1);
  int status = wait_exit(run, 60);
  ASSERT_NE(status, -1) << read(path("run.log"));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << read(path("run.log"));
  const std::string log = read(path("run.log"));
  EXPECT_NE(log.find("got SIGTERM: stopping; 1 segment(s) kept"), std::string::npos) << log;
  EXPECT_NE(log.find("stopped the snapshot agent"), std::string::npos) << log;
  EXPECT_TRUE(holds_step(names[0], 4));
  EXPECT_NE(::kill(agent, 0), 0);
}

// An agent that does not stop on SIGTERM (stopped here: hung) is killed after 5 s and leaves
// its socket and lock; weft run removes them after it reaped it. The segments stay.
TEST_F(SnapshotAgentRun, RemovesTheSocketAndLockOfAnAgentItHadToKill) {
  pid_t run = start_run();
  SnapshotAgentClient client(milliseconds(10000));
  const Committed c = commit_one(client, 4);
  ASSERT_FALSE(c.segment.empty());
  const std::string sock = worker_socket(), lock = "/dev/shm/weft-agent-" + run_job_ + "-n0.lock";
  ASSERT_TRUE(fs::exists(sock) && fs::exists(lock));
  ASSERT_EQ(::kill(c.agent, SIGSTOP), 0);
  end_workers(1);
  int status = wait_exit(run, 60);
  ASSERT_NE(status, -1) << read(path("run.log"));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << read(path("run.log"));
  const std::string log = read(path("run.log"));
  EXPECT_NE(log.find("removed " + sock + ", left by a killed snapshot agent"), std::string::npos)
      << log;
  EXPECT_NE(log.find("removed " + lock + ", left by a killed snapshot agent"), std::string::npos)
      << log;
  EXPECT_FALSE(fs::exists(sock));
  EXPECT_FALSE(fs::exists(lock));
  EXPECT_TRUE(holds_step(c.segment, 4));
  EXPECT_NE(::kill(c.agent, 0), 0);
}

// The real worker refuses a snapshot.* key that would do nothing (exit 2); the agent weft run
// started for it is still stopped and reaped. Replicas on one node are refused by weft run
// itself, before any agent starts. Without snapshot.every no agent starts.
TEST_F(SnapshotAgentRun, AgentOfARefusingWorkerIsStoppedAndNoneStartsWithoutSnapshots) {
  const std::string tiny = std::string(WEFT_SOURCE_DIR) + "/configs/gpt-tiny.yaml";
  // The worker refuses snapshot.ec without redundancy ec (it would do nothing): the job
  // fails (exit 2) and weft run stops its agent.
  pid_t run = start({"run", "--standalone", "--nproc-per-node", "1", "--rdzv-id", run_id_, "--",
                     "weft", "train", "--config", tiny, "--set", "snapshot.every=5", "--set",
                     "snapshot.ec.k=3", "--set", "train.out_dir=" + path("out")},
                    path("run.log"));
  int status = wait_exit(run, 120);
  ASSERT_NE(status, -1) << read(path("run.log"));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << read(path("run.log"));
  std::string log = read(path("run.log"));
  EXPECT_NE(log.find("snapshot.ec.k: snapshot.ec applies to snapshot.redundancy: ec only"),
            std::string::npos)
      << log;
  const pid_t agent =
      std::stoi(wait_for(path("run.log"), R"(started the snapshot agent \(pid (\d+)\))"));
  EXPECT_NE(log.find("stopped the snapshot agent (pid " + std::to_string(agent) + ")"),
            std::string::npos)
      << log;
  EXPECT_NE(::kill(agent, 0), 0);

  pid_t one = start({"run", "--standalone", "--nproc-per-node", "1", "--rdzv-id", run_id_ + "-one",
                     "--", "weft", "train", "--config", tiny, "--set", "snapshot.every=5", "--set",
                     "snapshot.redundancy=replica", "--set", "train.out_dir=" + path("out1")},
                    path("one.log"));
  status = wait_exit(one, 60);
  ASSERT_NE(status, -1) << read(path("one.log"));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << read(path("one.log"));
  EXPECT_NE(read(path("one.log")).find("snapshot.redundancy: replica needs at least 2 nodes"),
            std::string::npos)
      << read(path("one.log"));
  EXPECT_EQ(read(path("one.log")).find("started the snapshot agent"), std::string::npos)
      << read(path("one.log"));

  pid_t plain = start({"run", "--standalone", "--nproc-per-node", "1", "--", path("bin/weft"),
                       "train", "--config", tiny},
                      path("plain.log"));
  end_workers(0);
  status = wait_exit(plain, 60);
  ASSERT_NE(status, -1) << read(path("plain.log"));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << read(path("plain.log"));
  EXPECT_EQ(read(path("plain.log")).find("snapshot agent"), std::string::npos)
      << read(path("plain.log"));
  EXPECT_TRUE(read(path("socket")).find_first_not_of("\n") == std::string::npos)
      << "no WEFT_SNAPSHOT_SOCKET";
}

}  // namespace
}  // namespace weft::checkpoint
