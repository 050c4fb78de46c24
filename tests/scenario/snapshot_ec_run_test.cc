// snapshot.redundancy: ec under three real `weft run` nodes on loopback (issue 15), with
// stand-in workers (a script named weft) and the test writing the snapshots into each node's
// agent as a worker does: an agent restarted by its weft run moments before another node is
// lost. Every process is reaped and every segment unlinked however the test ends.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <map>
#include <regex>
#include <thread>

#include "checkpoint/job_id.h"
#include "checkpoint/snapshot_protocol.h"
#include "checkpoint/snapshot_segment.h"
#include "tests/scenario/snapshot_fixture.h"
#include "tests/support/agent_tests.h"

namespace weft::checkpoint {
namespace {

constexpr int kNodes = 3;
constexpr double kHeartbeatTimeout = 4;

class SnapshotEcRun : public SnapshotProcessTest {
 protected:
  void SetUp() override {
    SnapshotProcessTest::SetUp();
    fs::create_directories(dir_ / "bin");
    // Records its node and socket; an epoch-1 worker runs until weft run stops it, a later
    // one until the file `go` exists.
    std::ofstream(path("bin/weft"))
        << "#!/bin/sh\n"
        << "echo \"$WEFT_SNAPSHOT_SOCKET\" > " << path("w.tmp.$$") << "\n"
        << "mv " << path("w.tmp.$$") << " " << path("w-$GROUP_RANK-$WEFT_RDZV_EPOCH") << "\n"
        << "while [ ! -f " << path("go") << " ] || [ \"$WEFT_RDZV_EPOCH\" = 1 ]; do sleep 0.05; done\n"
        << "exit 0\n";
    fs::permissions(path("bin/weft"), fs::perms::owner_all);
    run_id_ = "snapec-" + job_;
    run_job_ = job_id_for_run(run_id_);
    jobs_.push_back(run_job_);
    port_ = test::free_port();
  }
  std::string run_log(int i) const { return path("run" + std::to_string(i) + ".log"); }
  pid_t start_node(int i) {
    return start({"run", "--nnodes", "2:3", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                  "--rdzv-id", run_id_, "--rdzv-endpoint", "127.0.0.1:" + std::to_string(port_),
                  "--max-restarts", "3", "--monitor-interval", "0.05", "--rdzv-conf",
                  "heartbeat_interval=0.25,heartbeat_timeout=" +
                      std::to_string(int(kHeartbeatTimeout)) +
                      ",last_call_timeout=1,join_timeout=60",
                  "--", path("bin/weft"), "train", "--config",
                  std::string(WEFT_SOURCE_DIR) + "/configs/gpt-tiny.yaml", "--set",
                  "snapshot.every=5", "--set", "snapshot.redundancy=ec"},
                 run_log(i), {{"WEFT_JOB_TOKEN", "ec-run-test-token"}});
  }
  std::string run_logs() const {
    std::string out;
    for (int i = 0; i < kNodes; ++i) out += "--- weft run " + std::to_string(i) + "\n" + read(run_log(i));
    return out;
  }
  // The pid of the agent weft run `i` started `count`-th, and its node index and socket.
  struct Agent {
    pid_t pid = -1;
    int node = -1;
    std::string socket;
  };
  Agent agent_of(int i, size_t count = 1) {
    const std::regex r(R"(started the snapshot agent \(pid (\d+)\) for job \w+ on node (\d+) at (\S+))");
    Agent a;
    poll([&] {
      const std::string text = read(run_log(i));
      size_t n = 0;
      for (auto it = std::sregex_iterator(text.begin(), text.end(), r); it != std::sregex_iterator(); ++it)
        if (++n == count) a = {std::stoi((*it)[1]), std::stoi((*it)[2]), (*it)[3]};
      return a.pid > 0;
    });
    return a;
  }
  static bool gone(pid_t pid) {  // not ours to reap: ended, or a zombie
    if (::kill(pid, 0) != 0) return true;
    std::ifstream st("/proc/" + std::to_string(pid) + "/stat");
    std::string a, b, state;
    st >> a >> b >> state;
    return state == "Z";
  }
  // Three nodes in epoch 1, each with one committed snapshot of steps 5 and 6 erasure-coded
  // across them. D: the store's host (run 0), which survives and keeps beating; Y, the node
  // before it in the ring, is the one lost; X, the one after, is the one whose agent dies.
  void start_and_commit() {
    runs_.push_back(start_node(0));  // the first one hosts the rendezvous store
    wait_for(run_log(0), "serves the rendezvous store");
    runs_.push_back(start_node(1));
    runs_.push_back(start_node(2));
    for (int n = 0; n < kNodes; ++n)
      ASSERT_TRUE(poll([&] { return fs::exists(path("w-" + std::to_string(n) + "-1")); }, 60))
          << "epoch 1 did not form with three nodes\n"
          << run_logs();
    for (int i = 0; i < kNodes; ++i) {
      agents_.push_back(agent_of(i));
      ASSERT_GT(agents_.back().pid, 0) << run_logs();
      run_of_[agents_.back().node] = i;
    }
    ASSERT_EQ(run_of_.size(), size_t(kNodes)) << run_logs();
    d_ = agents_[0].node;
    y_ = (d_ + 2) % kNodes;
    x_ = (d_ + 1) % kNodes;
    // Every agent has epoch 1's ring before the first commit: a holder without it yet refuses
    // the chunks ("no ring of epoch 1 here yet"), and they are sent again only at the next
    // commit, which this test does not make.
    for (int i = 0; i < kNodes; ++i)
      wait_for(run_log(i), "weft run: epoch 1: this node's snapshots are erasure-coded");
    const int64_t bytes = kBytes;
    std::vector<std::string> data(kNodes);
    for (int64_t step : {5, 6})
      for (int n = 0; n < kNodes; ++n) {
        SnapshotAgentClient c(milliseconds(10000));
        c.connect(agents_[size_t(run_of_[n])].socket);
        if (data[size_t(n)].empty())
          data[size_t(n)] = c.segment(Reservation{run_job_, n, 1, {{n, kNodes, bytes}}, 0}).at(0);
        write_snapshot(data[size_t(n)], run_job_, n, 1, n, kNodes, step, bytes);
        c.committed(data[size_t(n)], step);
      }
    // Node n holds the parity of stripe (n + 1) % 3 (one rank per node).
    ASSERT_TRUE(poll(
        [&] {
          for (int n = 0; n < kNodes; ++n) {
            try {
              auto v = SnapshotSegment::open(
                           segment_name(run_job_, SegmentKind::kParity, n, 1, (n + 1) % 3), false)
                           .latest();
              if (!v || v->meta.step != 6) return false;
            } catch (const std::exception&) {
              return false;
            }
          }
          return true;
        },
        60))
        << run_logs();
  }
  // Y lost whole: its weft run killed (its agent stops), then its memory gone.
  void lose_y() {
    const int run_y = run_of_[y_];
    ::kill(runs_[size_t(run_y)], SIGKILL);
    EXPECT_NE(wait_exit(runs_[size_t(run_y)], 10), -1);
    ASSERT_TRUE(poll([&] { return gone(agents_[size_t(run_y)].pid); }, 20)) << run_logs();
    for (const std::string& name : snapshot_segments(run_job_)) {
      const auto p = parse_segment_name(name);
      if (p && p->owner_node == y_ && p->kind != SegmentKind::kRebuilt)
        SnapshotSegment::unlink(name);
    }
  }
  // D's agent rebuilt Y's rank from the parity, with X's agent asked where it is now; then the
  // job ends well.
  void expect_rebuilt_through_xs_new_agent() {
    const Agent restarted = agent_of(run_of_[x_], 2);
    ASSERT_GT(restarted.pid, 0) << run_logs();
    SnapshotAgentClient c(milliseconds(90000));
    c.connect(agents_[size_t(run_of_[d_])].socket);
    int rebuilt = 0;
    for (const SegmentInfo& s : c.list(2)) {
      const auto p = parse_segment_name(s.name);
      if (!p || p->kind != SegmentKind::kRebuilt) continue;
      ++rebuilt;
      ASSERT_TRUE(s.committed) << s.name;
      EXPECT_EQ(s.committed->owner_node, y_);
      EXPECT_EQ(s.committed->rank, y_);
      EXPECT_EQ(s.committed->step, 6);
      EXPECT_TRUE(holds_step(s.name, 6)) << s.name;
    }
    EXPECT_EQ(rebuilt, 1) << run_logs();
    const std::string log = read(run_log(run_of_[d_]));
    EXPECT_EQ(log.find("more than m"), std::string::npos) << log;
    // D's agent had X's old endpoint in epoch 1's ring and found X at its new one.
    EXPECT_NE(log.find("node " + std::to_string(x_) + " of epoch 1 is node "), std::string::npos)
        << log;
    EXPECT_NE(log.find("(its agent restarted: epoch 1's ring had it at "), std::string::npos)
        << log;

    std::ofstream(path("go")) << "1\n";
    for (int i = 0; i < kNodes; ++i) {
      if (i == run_of_[y_]) continue;
      const int status = wait_exit(runs_[size_t(i)], 60);
      EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0) << run_logs();
    }
  }
  std::vector<pid_t> runs_;
  std::map<int, int> run_of_;  // node index in epoch 1 -> weft run
  std::vector<Agent> agents_;
  int d_ = -1, y_ = -1, x_ = -1;
  std::string run_id_, run_job_;
  int port_ = 0;
};

// Node X's agent is killed and restarted by its weft run (a new port) while node Y is being
// lost; node D, the first survivor after Y and so the one to rebuild it, still has X's old
// endpoint in epoch 1's ring (its weft run, already in epoch 2, never tells it epoch 1 again).
// The window is held open by stopping X's weft run from the agent's kill until D's weft run
// has seen the new membership: X's restart can then only come after D left epoch 1.
// Before, D counted X lost too (two of three: more than m) and rebuilt nothing.
TEST_F(SnapshotEcRun, AnAgentRestartedJustBeforeANodeLossLeavesTheLostNodeRebuilt) {
  ASSERT_NO_FATAL_FAILURE(start_and_commit());
  // X's agent dies just before Y is lost; X's weft run restarts it only once D's weft run is
  // in epoch 2. (A lost node's closed store connection is noticed within about 0.3 s, so X's
  // agent goes first; X's weft run is stopped for well under its heartbeat timeout.)
  const int run_x = run_of_[x_];
  ASSERT_EQ(::kill(runs_[size_t(run_x)], SIGSTOP), 0);
  ::kill(agents_[size_t(run_x)].pid, SIGKILL);
  ASSERT_NO_FATAL_FAILURE(lose_y());
  wait_for(run_log(run_of_[d_]), "membership changed: epoch 1 -> 2", 1, 30);
  ASSERT_EQ(::kill(runs_[size_t(run_x)], SIGCONT), 0);
  expect_rebuilt_through_xs_new_agent();
}

// X's agent is alive but does not answer (stopped) while Y is lost, so X's weft run publishes
// that agent's endpoint for epoch 2, and dies only once D's agent is asking it: as under load
// in CI, where a killed agent took about a second to be gone and its weft run published its
// endpoint meanwhile. D's agent asks X again at the endpoint epoch 2's ring names once X's
// weft run restarted it (ask_member), instead of counting X's fragments lost at once.
// Before, D's rebuild failed ("no step has every stripe's fragments") and the node's ranks
// went back to the disk checkpoint.
TEST_F(SnapshotEcRun, AMembersAgentThatDiesAfterItsEndpointWasPublishedIsAskedWhereItRestarted) {
  ASSERT_NO_FATAL_FAILURE(start_and_commit());
  const int run_x = run_of_[x_];
  const pid_t xs_agent = agents_[size_t(run_x)].pid;
  ASSERT_EQ(::kill(xs_agent, SIGSTOP), 0);
  // However the test ends: a stopped agent would not act on the SIGTERM its weft run's end
  // sends it.
  struct Resume {
    pid_t pid;
    ~Resume() { ::kill(pid, SIGCONT); }
  } resume{xs_agent};
  ASSERT_NO_FATAL_FAILURE(lose_y());
  // D's weft run told its agent epoch 2's ring: X's weft run had published the stopped
  // agent's endpoint for it.
  wait_for(run_log(run_of_[d_]), "weft run: epoch 2: ", 1, 30);
  // D's agent is asking X's stopped agent (its connection waits in the listener's backlog);
  // the agent's death resets it.
  std::this_thread::sleep_for(milliseconds(300));
  ::kill(xs_agent, SIGKILL);
  expect_rebuilt_through_xs_new_agent();
}

}  // namespace
}  // namespace weft::checkpoint
