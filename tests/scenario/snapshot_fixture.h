// Real `weft` processes for the snapshot scenario tests (the agent alone, weft run with its
// agent, agents on loopback with replica or ec peers): a fixture that starts them and always
// reaps them, stopped or not, and unlinks every segment, agent socket and lock of the test's
// jobs however the test ends; snapshots with a known byte pattern, written as a worker does.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "checkpoint/job_id.h"
#include "checkpoint/snapshot_protocol.h"
#include "checkpoint/snapshot_segment.h"
#include "tests/support/snapshot_leftovers.h"

namespace weft::checkpoint {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

inline constexpr int64_t kBytes = 3 * (int64_t(1) << 20) + 4096;  // four crc blocks, the last short

inline uint8_t pattern(int64_t step, int rank, int64_t i) {
  return uint8_t((i * 131 + step * 7 + rank * 31) & 0xff);
}

// Writes a snapshot of `step` into segment `name` as a worker does: open writable, begin,
// fill with pattern(step, rank, .), commit.
inline void write_snapshot(const std::string& name, const std::string& job, int node, int64_t epoch,
                           int rank, int world, int64_t step, int64_t bytes = kBytes) {
  SnapshotSegment seg = SnapshotSegment::open(name, true);
  SnapshotMeta m;
  m.job_id = job;
  m.owner_node = node;
  m.epoch = epoch;
  m.step = step;
  m.rank = rank;
  m.world = world;
  m.layout_hash = 0x1234abcd5678ef00ULL + uint64_t(rank);
  m.payload_bytes = bytes;
  auto* p = static_cast<uint8_t*>(seg.begin(m));
  for (int64_t i = 0; i < bytes; ++i) p[i] = pattern(step, rank, i);
  seg.commit();
}

// Whether segment `name`'s newest committed slot is write_snapshot's of `step`, intact.
inline bool holds_step(const std::string& name, int64_t step) {
  SnapshotSegment seg = SnapshotSegment::open(name, false);
  auto v = seg.latest();
  if (!v || v->meta.step != step || !seg.corrupt_blocks(*v).empty()) return false;
  auto* p = static_cast<const uint8_t*>(v->payload);
  for (int64_t i = 0; i < v->meta.payload_bytes; ++i)
    if (p[i] != pattern(step, v->meta.rank, i)) return false;
  return true;
}

// Whether two segments' newest committed slots hold the same payload bytes.
inline bool same_bytes(const std::string& a, const std::string& b) {
  SnapshotSegment x = SnapshotSegment::open(a, false), y = SnapshotSegment::open(b, false);
  auto vx = x.latest(), vy = y.latest();
  return vx && vy && vx->meta.payload_bytes == vy->meta.payload_bytes &&
         std::memcmp(vx->payload, vy->payload, size_t(vx->meta.payload_bytes)) == 0 &&
         y.corrupt_blocks(*vy).empty();
}

inline bool exists(const std::string& name) { return fs::exists("/dev/shm" + name); }

class SnapshotProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Short: a Unix socket path in it has at most 107 bytes.
    dir_ = fs::temp_directory_path() /
           ("weft_snap_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    job_ = job();
  }
  void TearDown() override {
    for (pid_t pid : pids_) {  // whatever the test left running, stopped or not
      if (pid <= 0) continue;  // reaped by the test already (its number may be reused)
      ::kill(pid, SIGCONT);
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    for (const std::string& j : jobs_) weft::test::remove_snapshot_leftovers(j);
    fs::remove_all(dir_);
  }

  std::string path(const std::string& f) const { return (dir_ / f).string(); }
  // A fresh job id whose segments TearDown removes.
  std::string job() {
    jobs_.push_back(new_job_id());
    return jobs_.back();
  }
  std::string read(const std::string& file) const {
    std::ifstream in(file);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }

  // `weft ARGS...` with its output in `log` and `env` set, killed with this test process if
  // it dies; TearDown kills and reaps it unless the test did.
  pid_t start(const std::vector<std::string>& args, const std::string& log,
              const std::vector<std::pair<std::string, std::string>>& env = {}) {
    const pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::setenv("OMP_NUM_THREADS", "1", 1);
      for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> argv{const_cast<char*>("weft")};
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(WEFT_BINARY, argv.data());
      ::_exit(127);
    }
    pids_.push_back(pid);
    return pid;
  }
  // The exit status of `pid` (reaped), or -1 when it is still running after `seconds`.
  int wait_exit(pid_t pid, double seconds) {
    const auto until = Clock::now() + milliseconds(int64_t(seconds * 1000));
    for (;;) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        std::replace(pids_.begin(), pids_.end(), pid, pid_t(0));  // reaped: TearDown skips it
        return status;
      }
      if (Clock::now() > until) return -1;
      std::this_thread::sleep_for(milliseconds(10));
    }
  }
  void kill9(pid_t pid) {
    ::kill(pid, SIGKILL);
    EXPECT_NE(wait_exit(pid, 10), -1);
  }
  // Waits until `file` holds `count` matches of `re`; the last match's first group.
  std::string wait_for(const std::string& file, const std::string& re, size_t count = 1,
                       double seconds = 20) {
    const std::regex r(re);
    const auto until = Clock::now() + milliseconds(int64_t(seconds * 1000));
    while (Clock::now() < until) {
      const std::string text = read(file);
      std::vector<std::string> found;
      for (auto it = std::sregex_iterator(text.begin(), text.end(), r);
           it != std::sregex_iterator(); ++it)
        found.push_back((*it).size() > 1 ? (*it)[1].str() : (*it)[0].str());
      if (found.size() >= count) return found[count - 1];
      std::this_thread::sleep_for(milliseconds(20));
    }
    ADD_FAILURE() << "no " << count << " match(es) of '" << re << "' in " << file << ":\n"
                  << read(file);
    return "";
  }
  // Polls `done` every ms for at most `seconds`.
  static bool poll(const std::function<bool()>& done, double seconds = 20) {
    const auto until = Clock::now() + milliseconds(int64_t(seconds * 1000));
    while (!done()) {
      if (Clock::now() > until) return false;
      std::this_thread::sleep_for(milliseconds(1));
    }
    return true;
  }

  fs::path dir_;
  std::string job_;
  std::vector<pid_t> pids_;  // 0: reaped by the test
  std::vector<std::string> jobs_;
};

// Agents on loopback as the nodes of one job (snapshot.redundancy replica and ec): node n's
// agent serves socket(n) and logs to log(n).
class SnapshotPeersTest : public SnapshotProcessTest {
 protected:
  std::string logs(int nodes) const {
    std::string out;
    for (int n = 0; n < nodes; ++n) out += "--- agent " + std::to_string(n) + "\n" + read(log(n));
    return out;
  }
  std::string socket(int node) const { return path("agent" + std::to_string(node) + ".sock"); }
  std::string log(int node) const { return path("agent" + std::to_string(node) + ".log"); }

  // `weft snapshot-agent` for node `node` listening on loopback, with `token` and
  // `redundancy` (e.g. {"--redundancy", "replica"}).
  pid_t start_agent(int node, const std::string& token,
                    const std::vector<std::string>& redundancy) {
    std::vector<std::string> args = {"snapshot-agent",     "--job",    job_,         "--node",
                                     std::to_string(node), "--socket", socket(node), "--listen",
                                     "127.0.0.1:0"};
    args.insert(args.end(), redundancy.begin(), redundancy.end());
    std::vector<std::pair<std::string, std::string>> env = {{"WEFT_JOB_TOKEN", token}};
    env.insert(env.end(), agent_env_.begin(), agent_env_.end());
    return start(args, log(node), env);
  }
  // More environment for the agents start_agent starts (e.g. WEFT_SNAPSHOT_TIMEOUT_MS).
  std::vector<std::pair<std::string, std::string>> agent_env_;
  std::unique_ptr<SnapshotAgentClient> client(int node) {
    auto c = std::make_unique<SnapshotAgentClient>(milliseconds(10000));
    c->connect(socket(node));
    return c;
  }
  // The step of the replica `name` in agent `c`'s list (-1: not listed or nothing committed).
  static int64_t listed_step(SnapshotAgentClient& c, const std::string& name) {
    for (const SegmentInfo& s : c.list())
      if (s.name == name && s.committed) return s.committed->step;
    return -1;
  }
  // Node `n` dies whole: its agent (the n-th process started) is killed and its memory goes
  // with it: the segments it owns (data and parity). Rebuilt segments named for it belong to
  // the node that rebuilt (or made ahead) them, and stay.
  void lose(int n) {
    ::kill(pids_[size_t(n)], SIGKILL);
    ::waitpid(pids_[size_t(n)], nullptr, 0);
    pids_[size_t(n)] = 0;  // reaped
    for (const std::string& name : snapshot_segments(job_)) {
      const auto p = parse_segment_name(name);
      if (p && p->owner_node == n && p->kind != SegmentKind::kRebuilt) SnapshotSegment::unlink(name);
    }
  }
};

}  // namespace weft::checkpoint
