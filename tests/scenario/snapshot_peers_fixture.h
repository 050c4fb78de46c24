// Real `weft snapshot-agent` processes on loopback for the tests of their peer traffic
// (snapshot.redundancy replica and ec): a fixture that starts and always reaps them and
// unlinks every segment of the test's job, and snapshots with a known byte pattern.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/job_id.h"
#include "checkpoint/snapshot_protocol.h"
#include "checkpoint/snapshot_segment.h"

namespace weft::checkpoint {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

inline constexpr int64_t kBytes = 3 * (int64_t(1) << 20) + 4096;  // four crc blocks, the last short

inline uint8_t pattern(int64_t step, int rank, int64_t i) {
  return uint8_t((i * 131 + step * 7 + rank * 31) & 0xff);
}

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

// Whether two segments' newest committed slots hold the same payload bytes.
inline bool same_bytes(const std::string& a, const std::string& b) {
  SnapshotSegment x = SnapshotSegment::open(a, false), y = SnapshotSegment::open(b, false);
  auto vx = x.latest(), vy = y.latest();
  return vx && vy && vx->meta.payload_bytes == vy->meta.payload_bytes &&
         std::memcmp(vx->payload, vy->payload, size_t(vx->meta.payload_bytes)) == 0 &&
         y.corrupt_blocks(*vy).empty();
}

inline bool exists(const std::string& name) { return fs::exists("/dev/shm" + name); }

class SnapshotPeersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("weft_snappeers_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    job_ = new_job_id();
  }
  void TearDown() override {
    for (pid_t pid : pids_) {
      if (pid <= 0) continue;  // reaped by the test already (its number may be reused)
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    for (const std::string& name : snapshot_segments(job_)) SnapshotSegment::unlink(name);
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("/dev/shm", ec))
      if (e.path().filename().string().starts_with("weft-agent-" + job_)) fs::remove(e.path(), ec);
    fs::remove_all(dir_);
  }

  std::string path(const std::string& f) const { return (dir_ / f).string(); }
  std::string read(const std::string& file) const {
    std::ifstream in(file);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  std::string logs(int nodes) const {
    std::string out;
    for (int n = 0; n < nodes; ++n) out += "--- agent " + std::to_string(n) + "\n" + read(log(n));
    return out;
  }
  std::string socket(int node) const { return path("agent" + std::to_string(node) + ".sock"); }
  std::string log(int node) const { return path("agent" + std::to_string(node) + ".log"); }

  // `weft snapshot-agent` for node `node` listening on loopback, with `token` and
  // `redundancy` (e.g. {"--redundancy", "replica"}).
  pid_t start_agent(int node, const std::string& token, const std::vector<std::string>& redundancy) {
    std::vector<std::string> args = {"snapshot-agent", "--job",    job_,         "--node",
                                     std::to_string(node), "--socket", socket(node), "--listen",
                                     "127.0.0.1:0"};
    args.insert(args.end(), redundancy.begin(), redundancy.end());
    const std::string out = log(node);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::setenv("WEFT_JOB_TOKEN", token.c_str(), 1);
      std::vector<char*> argv{const_cast<char*>("weft")};
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(WEFT_BINARY, argv.data());
      ::_exit(127);
    }
    pids_.push_back(pid);
    return pid;
  }
  std::unique_ptr<SnapshotAgentClient> client(int node) {
    auto c = std::make_unique<SnapshotAgentClient>(milliseconds(10000));
    c->connect(socket(node));
    return c;
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
  // The step of the replica `name` in agent `c`'s list (-1: not listed or nothing committed).
  static int64_t listed_step(SnapshotAgentClient& c, const std::string& name) {
    for (const SegmentInfo& s : c.list())
      if (s.name == name && s.committed) return s.committed->step;
    return -1;
  }

  fs::path dir_;
  std::string job_;
  std::vector<pid_t> pids_;
};

}  // namespace weft::checkpoint
