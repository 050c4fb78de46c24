// `weft snapshot ls|verify|clean` run as a user would: segments made here, some owned by a
// process that has exited (abandoned), one by this test process (alive); `ls` lists them,
// `verify` finds a flipped byte (exit 1), `clean --job` removes only the abandoned ones of
// that job, `--all` the live one too, and the socket and lock a killed agent left (a live
// agent's stay). Every command names a job of its own: a test never touches another job's
// segments.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <vector>

#include "checkpoint/job_id.h"
#include "checkpoint/snapshot_agent_files.h"
#include "checkpoint/snapshot_segment.h"
#include "tests/support/eventually.h"
#include "tests/support/run_weft.h"

namespace weft::checkpoint {
namespace {

using ::weft::test::CommandResult;
CommandResult weft(const std::string& args) { return ::weft::test::run_weft(args); }

// The pid of a process that has exited and been reaped.
int dead_pid() {
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return int(pid);
}

bool has(const std::string& out, const std::string& what) {
  return out.find(what) != std::string::npos;
}

// The line of `out` that names `segment` ("" when none does).
std::string line_of(const std::string& out, const std::string& segment) {
  size_t at = out.find(segment);
  if (at == std::string::npos) return "";
  size_t start = out.rfind('\n', at);
  start = start == std::string::npos ? 0 : start + 1;
  return out.substr(start, out.find('\n', at) - start);
}

class SnapshotCli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(WEFT_BINARY)) << WEFT_BINARY << " is built with every test";
  }
  void TearDown() override {
    for (const std::string& job : {job_, other_})
      for (const std::string& n : snapshot_segments(job)) SnapshotSegment::unlink(n);
  }
  // A segment of `job` for `rank` owned by `owner`, with a committed step `step` when >= 0.
  std::string make(const std::string& job, int rank, int owner, int64_t step) {
    std::string n = segment_name(job, SegmentKind::kData, 1, 2, rank);
    SnapshotSegment s = SnapshotSegment::create(n, 3 << 20, owner);
    if (step >= 0) {
      SnapshotMeta m;
      m.job_id = job;
      m.owner_node = 1;
      m.epoch = 2;
      m.step = step;
      m.rank = rank;
      m.world = 4;
      m.payload_bytes = (2 << 20) + 512;
      std::memset(s.begin(m), rank + 1, size_t(m.payload_bytes));
      s.commit();
    }
    return n;
  }
  const std::string job_ = new_job_id(), other_ = new_job_id();
};

TEST_F(SnapshotCli, LsListsAJobsSegmentsWithTheirOwners) {
  const int dead = dead_pid();
  std::string abandoned = make(job_, 0, dead, 40), live = make(job_, 1, ::getpid(), 41);
  std::string empty = make(job_, 2, ::getpid(), -1), foreign = make(other_, 0, dead, 7);
  CommandResult r = weft("snapshot ls --job " + job_);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_FALSE(has(r.out, foreign)) << r.out;
  std::string a = line_of(r.out, abandoned), l = line_of(r.out, live), e = line_of(r.out, empty);
  EXPECT_TRUE(has(a, " data ") && has(a, " 0/4 ") && has(a, " 40 ") && has(a, " 2.0 ") &&
              has(a, std::to_string(dead) + " gone"))
      << a;
  EXPECT_TRUE(has(l, " 1/4 ") && has(l, " 41 ") && has(l, std::to_string(::getpid()) + " alive"))
      << l;
  EXPECT_TRUE(has(e, " 2/? ") && has(e, " - ")) << e;  // no snapshot committed yet
  EXPECT_TRUE(has(r.out, "3 segments of job " + job_ + ", 1 with their owner gone")) << r.out;
  // Without --job every job's segments are listed.
  CommandResult every = weft("snapshot ls");
  ASSERT_EQ(every.code, 0) << every.out;
  EXPECT_TRUE(has(every.out, abandoned) && has(every.out, foreign)) << every.out;
}

TEST_F(SnapshotCli, VerifyFindsAFlippedByteAndExitsOne) {
  std::string good = make(job_, 0, ::getpid(), 10), bad = make(job_, 1, ::getpid(), 10);
  {
    SnapshotSegment s = SnapshotSegment::open(good, true);
    SnapshotMeta m = s.latest()->meta;
    m.step = 11;
    std::memset(s.begin(m), 7, size_t(m.payload_bytes));
    s.commit();
  }
  CommandResult ok = weft("snapshot verify --job " + job_);
  EXPECT_EQ(ok.code, 0) << ok.out;
  EXPECT_TRUE(has(line_of(ok.out, bad), ": ok (slot 0 step 10)")) << ok.out;
  {
    SnapshotSegment s = SnapshotSegment::open(bad, true);
    auto* p = static_cast<char*>(const_cast<void*>(s.latest()->payload));
    p[(1 << 20) + 99] ^= 0x10;  // block 1
  }
  CommandResult r = weft("snapshot verify --job " + job_);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(line_of(r.out, bad), "CORRUPT (slot 0 step 10: 1 corrupt block at 1)")) << r.out;
  EXPECT_TRUE(has(line_of(r.out, good), ": ok (slot 0 step 10; slot 1 step 11)")) << r.out;
  EXPECT_TRUE(has(r.out, "1 of 2 segments of job " + job_ + " failed verification")) << r.out;
}

TEST_F(SnapshotCli, CleanRemovesTheAbandonedAndKeepsTheLive) {
  const int dead = dead_pid();
  std::string abandoned = make(job_, 0, dead, 40), also = make(job_, 1, dead, -1);
  std::string live = make(job_, 2, ::getpid(), 41), foreign = make(other_, 0, dead, 7);
  CommandResult r = weft("snapshot clean --job " + job_);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(line_of(r.out, abandoned), "removed")) << r.out;
  EXPECT_TRUE(has(line_of(r.out, also), "removed")) << r.out;
  EXPECT_TRUE(has(line_of(r.out, live), "kept")) << r.out;
  EXPECT_EQ(snapshot_segments(job_), std::vector<std::string>{live});
  EXPECT_EQ(snapshot_segments(other_), std::vector<std::string>{foreign})
      << "clean --job removed another job's segment";
  // --all removes the live one too, and says so.
  CommandResult all = weft("snapshot clean --job " + job_ + " --all");
  ASSERT_EQ(all.code, 0) << all.out;
  EXPECT_TRUE(has(line_of(all.out, live), "removed")) << all.out;
  EXPECT_TRUE(has(all.out, "WARNING") && has(all.out, "ALIVE")) << all.out;
  EXPECT_TRUE(snapshot_segments(job_).empty());
  EXPECT_EQ(snapshot_segments(other_), std::vector<std::string>{foreign});
}

// Real agents: one SIGKILLed (its socket and lock stay), one alive. clean removes the killed
// one's files and keeps the live one's, --all or not; the live one, stopped with SIGTERM,
// removes its own.
TEST_F(SnapshotCli, CleanRemovesAKilledAgentsSocketAndLockAndKeepsALiveOnes) {
  const std::string dir = std::filesystem::temp_directory_path() / ("weft_cli_" + job_);
  std::filesystem::create_directories(dir);
  std::vector<pid_t> agents;
  struct Reap {  // every agent reaped however the test ends
    std::vector<pid_t>& pids;
    ~Reap() {
      for (pid_t p : pids) ::kill(p, SIGKILL), ::waitpid(p, nullptr, 0);
    }
  } reap{agents};
  for (int node : {1, 2})
    agents.push_back(
        ::weft::test::start_weft({"snapshot-agent", "--job", job_, "--node", std::to_string(node),
                                  "--socket", agent_socket_path(job_, node)},
                                 dir + "/agent" + std::to_string(node) + ".log"));
  for (int node : {1, 2})
    ASSERT_TRUE(::weft::test::eventually([&] {
      return std::filesystem::exists(agent_socket_path(job_, node)) &&
             std::filesystem::exists(agent_lock_path(job_, node));
    })) << "agent "
        << node << " did not start";
  ::kill(agents[0], SIGKILL);
  ::waitpid(agents[0], nullptr, 0);
  agents.erase(agents.begin());
  ASSERT_TRUE(std::filesystem::exists(agent_socket_path(job_, 1)));  // what a kill leaves
  ASSERT_TRUE(std::filesystem::exists(agent_lock_path(job_, 1)));

  CommandResult r = weft("snapshot clean --job " + job_ + " --all");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const std::string& f : {agent_socket_path(job_, 1), agent_lock_path(job_, 1)}) {
    EXPECT_TRUE(has(line_of(r.out, f), "removed")) << r.out;
    EXPECT_FALSE(std::filesystem::exists(f)) << f;
  }
  EXPECT_TRUE(has(r.out, "and 2 files killed agents left")) << r.out;
  EXPECT_TRUE(std::filesystem::exists(agent_socket_path(job_, 2))) << r.out;
  EXPECT_TRUE(std::filesystem::exists(agent_lock_path(job_, 2))) << r.out;

  ::kill(agents[0], SIGTERM);
  ::waitpid(agents[0], nullptr, 0);
  agents.clear();
  EXPECT_FALSE(std::filesystem::exists(agent_socket_path(job_, 2)));
  EXPECT_FALSE(std::filesystem::exists(agent_lock_path(job_, 2)));
  std::filesystem::remove_all(dir);
}

TEST_F(SnapshotCli, BadArgumentsExitTwoNamingTheFlag) {
  CommandResult job = weft("snapshot ls --job NOT-A-JOB");
  EXPECT_EQ(job.code, 2) << job.out;
  EXPECT_TRUE(has(job.out, "--job")) << job.out;
  CommandResult flag = weft("snapshot verify --frobnicate");
  EXPECT_EQ(flag.code, 2) << flag.out;
  EXPECT_TRUE(has(flag.out, "--frobnicate")) << flag.out;
  CommandResult all = weft("snapshot ls --all");
  EXPECT_EQ(all.code, 2) << all.out;
  EXPECT_TRUE(has(all.out, "--all")) << all.out;
  CommandResult action = weft("snapshot frobnicate");
  EXPECT_EQ(action.code, 2) << action.out;
  EXPECT_TRUE(has(action.out, "frobnicate")) << action.out;
  CommandResult extra = weft("snapshot ls extra");
  EXPECT_EQ(extra.code, 2) << extra.out;
  CommandResult none = weft("snapshot");
  EXPECT_EQ(none.code, 2) << none.out;
  EXPECT_TRUE(has(none.out, "usage: weft snapshot")) << none.out;
  EXPECT_EQ(weft("snapshot --help").code, 0);
}

}  // namespace
}  // namespace weft::checkpoint
