// Several weft runs of one job starting at the same moment on one machine (issues 14/15): each
// names its node's snapshot agent by an index (its lock and socket) that no other live agent
// of the job holds here. Four `weft run --standalone --max-restarts 1` of one run id (each a
// job of one node, all under the same job id, so all four want index 0) are let go from one
// barrier, a few rounds: every one must get a live agent of its own under a distinct index
// and end well. While the choice was a look at the lock followed by the agent's own take of
// it, two of them could both see an index free and the second's agent failed its lock
// ("another agent serves job ..."), its weft run with it. Real processes; the fixture
// (snapshot_fixture.h) kills and reaps every one and removes the job's files however the
// test ends.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/job_id.h"
#include "checkpoint/snapshot_agent_files.h"
#include "checkpoint/snapshot_protocol.h"
#include "tests/scenario/snapshot_fixture.h"

namespace weft::checkpoint {
namespace {

constexpr int kRacers = 4;
constexpr int kRounds = 4;

class SnapshotAgentIndex : public SnapshotProcessTest {
 protected:
  // Racer `i`'s stand-in worker: a script named weft (so that `weft train --config X` with
  // snapshot.every set gets an agent) that records WEFT_SNAPSHOT_SOCKET in its folder and
  // exits 0 once the file `go` there is written.
  std::string racer_dir(int i) const { return path(std::string("r").append(std::to_string(i))); }
  std::string worker(int i) {
    const std::string d = racer_dir(i);
    fs::create_directories(d + "/bin");
    std::ofstream(d + "/bin/weft") << "#!/bin/sh\n"
                                   << "echo \"$WEFT_SNAPSHOT_SOCKET\" > " << d << "/socket.tmp\n"
                                   << "mv " << d << "/socket.tmp " << d << "/socket\n"
                                   << "while [ ! -e " << d << "/go ]; do sleep 0.05; done\n";
    fs::permissions(d + "/bin/weft", fs::perms::owner_all);
    return d + "/bin/weft";
  }
  // `weft ARGS...` (output in `log`) forked now, exec'd once the write end of the pipe
  // `barrier` is closed by this process (the child closes its own copy at once).
  pid_t start_at(const int barrier[2], const std::vector<std::string>& args,
                 const std::string& log) {
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      ::close(barrier[1]);
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::setenv("OMP_NUM_THREADS", "1", 1);
      std::vector<char*> argv{const_cast<char*>("weft")};
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      char c;
      while (::read(barrier[0], &c, 1) < 0 && errno == EINTR) {
      }
      ::execv(WEFT_BINARY, argv.data());
      ::_exit(127);
    }
    pids_.push_back(pid);
    return pid;
  }
  // The socket racer `i`'s worker was given, or "" once its weft run ended without one.
  std::string racer_socket(int i, pid_t run, int* status) {
    const std::string file = racer_dir(i) + "/socket";
    poll(
        [&] {
          if (fs::exists(file)) return true;
          *status = wait_exit(run, 0);
          return *status != -1;
        },
        60);
    std::string s = fs::exists(file) ? read(file) : "";
    while (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
};

TEST_F(SnapshotAgentIndex, WeftRunsOfOneJobStartedTogetherGetDistinctIndicesAndLiveAgents) {
  const std::string tiny = std::string(WEFT_SOURCE_DIR) + "/configs/gpt-tiny.yaml";
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const std::string run_id = "snapindex-" + job_ + "-" + std::to_string(round);
    const std::string job = job_id_for_run(run_id);
    jobs_.push_back(job);
    int barrier[2];
    ASSERT_EQ(::pipe2(barrier, O_CLOEXEC), 0);
    std::vector<pid_t> runs;
    std::vector<std::string> logs;
    for (int i = 0; i < kRacers; ++i) {
      fs::remove_all(racer_dir(i));
      const std::string script = worker(i);
      logs.push_back(racer_dir(i) + "/run.log");
      runs.push_back(start_at(barrier,
                              {"run", "--standalone", "--max-restarts", "1", "--nproc-per-node",
                               "1", "--rdzv-id", run_id, "--monitor-interval", "0.05", "--", script,
                               "train", "--config", tiny, "--set", "snapshot.every=5"},
                              logs.back()));
    }
    ::close(barrier[0]);
    ::close(barrier[1]);  // every racer's read returns now: they start together

    auto all_logs = [&] {
      std::string all;
      for (int j = 0; j < kRacers; ++j)
        all += "--- racer " + std::to_string(j) + "\n" + read(logs[size_t(j)]);
      return all;
    };
    std::set<std::string> sockets;
    std::string all;
    for (int i = 0; i < kRacers; ++i) {
      int status = -1;
      const std::string sock = racer_socket(i, runs[size_t(i)], &status);
      all = all_logs();
      ASSERT_FALSE(sock.empty()) << "racer " << i << " got no agent (exit status " << status
                                 << ")\n"
                                 << all;
      EXPECT_TRUE(sockets.insert(sock).second) << "racer " << i << " shares " << sock << "\n"
                                               << all;
      // Its own agent, live: it answers there, and its weft run started it under that name.
      SnapshotAgentClient client(milliseconds(10000));
      EXPECT_NO_THROW({
        client.connect(sock);
        client.list();
      }) << sock
         << "\n"
         << all;
      EXPECT_NE(read(logs[size_t(i)]).find(" at " + sock + "\n"), std::string::npos) << all;
      EXPECT_EQ(read(logs[size_t(i)]).find("another agent serves job"), std::string::npos) << all;
    }
    // Indices 0 to 3: the first free from the one wanted (0) up, one per racer.
    std::set<std::string> expected;
    for (int i = 0; i < kRacers; ++i) expected.insert(agent_socket_path(job, i));
    EXPECT_EQ(sockets, expected) << all;
    for (int i = 0; i < kRacers; ++i) std::ofstream(racer_dir(i) + "/go") << "\n";
    for (int i = 0; i < kRacers; ++i) {
      const int status = wait_exit(runs[size_t(i)], 60);
      EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "racer " << i << "\n"
          << read(logs[size_t(i)]);
    }
    for (const std::string& s : sockets) EXPECT_FALSE(fs::exists(s)) << s;
    if (::testing::Test::HasFailure()) return;
  }
}

// `--lock-fd` names a descriptor that does not hold the agent lock (here the agent's log, its
// stdout): the agent refuses to start, naming the option, the lock and the fix, and serves
// nothing.
TEST_F(SnapshotAgentIndex, ALockFdThatDoesNotHoldTheAgentLockIsRefusedNamingIt) {
  const pid_t agent = start({"snapshot-agent", "--job", job_, "--node", "0", "--socket",
                             path("agent.sock"), "--lock-fd", "1"},
                            path("agent.log"));
  const int status = wait_exit(agent, 10);
  ASSERT_NE(status, -1) << read(path("agent.log"));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << read(path("agent.log"));
  EXPECT_NE(read(path("agent.log"))
                .find("--lock-fd 1 does not hold " + agent_lock_path(job_, 0) +
                      " (another agent serves job " + job_ +
                      " on node 0, or the descriptor is "
                      "not that lock); start it without --lock-fd"),
            std::string::npos)
      << read(path("agent.log"));
  EXPECT_FALSE(fs::exists(path("agent.sock")));
}

}  // namespace
}  // namespace weft::checkpoint
