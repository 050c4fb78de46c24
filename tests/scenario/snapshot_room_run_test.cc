// Issue 15, end to end: a job whose in-memory snapshots do not fit in its node's shared
// memory stops before its first step, every worker with exit 2 naming snapshot.every and
// the ways out, and nothing is left behind. weft run, its snapshot agent and two real
// workers run in a private /dev/shm (tests/support/private_shm.h) that leaves a new segment
// 1 MiB; the same job with 32 MiB of room trains to its end, so the refusal is the room's.
// Skipped, saying why, where a private mount namespace is not permitted.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "tests/support/private_shm.h"
#include "tests/support/run_weft.h"

namespace weft::test {
namespace {

namespace fs = std::filesystem;

// `weft run` of gpt-tiny on two workers with a snapshot every step, in a private /dev/shm
// leaving `room` bytes to new segments; the private /dev/shm's entries afterwards in `left`.
CommandResult run_with_room(int64_t room, const std::string& name, std::string* left) {
  PrivateShm shm(PrivateShm::snapshot_margin() + room);
  if (!shm.skip_reason().empty()) return {-2, shm.skip_reason()};
  const std::string weft = WEFT_BINARY;
  const std::string id = "shm-room-" + name + "-" + std::to_string(::getpid());
  const fs::path out = fs::temp_directory_path() / ("weft_" + id);
  std::error_code ec;
  CommandResult r = run_command(
      "OMP_NUM_THREADS=1 " + weft + " run --standalone --nproc-per-node 2 --rdzv-id " + id +
      " -- " + weft + " train --config " + WEFT_SOURCE_DIR +
      "/configs/gpt-tiny.yaml --set snapshot.every=1 --set train.steps=4"
      " --set train.warmup_steps=1 --set train.out_dir=" + out.string());
  fs::remove_all(out, ec);
  for (const auto& e : fs::directory_iterator("/dev/shm", ec)) *left += e.path().string() + " ";
  const std::string error = shm.leave();
  if (!error.empty()) r.out += "\n" + error;
  return r;
}

TEST(SnapshotRoomRun, SnapshotsThatDoNotFitInSharedMemoryStopTheJobWithExitTwoNamingTheKey) {
  std::string left;
  const CommandResult r = run_with_room(int64_t(1) << 20, "full", &left);
  if (r.code == -2) GTEST_SKIP() << r.out;
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("weft train: error: snapshot.every: in-memory snapshots do not fit on "
                       "node 0"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("set snapshot.every: 0 (no in-memory snapshots)"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("weft run: failed: rank "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("step     0/4"), std::string::npos) << "a step ran\n" << r.out;
  EXPECT_NE(r.out.find("weft run: the snapshot agent (pid"), std::string::npos)
      << "the agent was not reaped\n" << r.out;
  EXPECT_EQ(left, "") << "left in /dev/shm\n" << r.out;
}

TEST(SnapshotRoomRun, TheSameJobWithRoomForItsSnapshotsTrainsToItsEnd) {
  std::string left;
  const CommandResult r = run_with_room(int64_t(32) << 20, "room", &left);
  if (r.code == -2) GTEST_SKIP() << r.out;
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("do not fit"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step     3/4"), std::string::npos) << r.out;
  EXPECT_EQ(left, "") << "left in /dev/shm\n" << r.out;
}

}  // namespace
}  // namespace weft::test
