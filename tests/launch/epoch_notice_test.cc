// The epoch notice's loss fields: what a worker in a given epoch concludes from the newest
// notice, whichever notices before it the worker never read.
#include "launch/epoch_notice.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace weft::launch {
namespace {

namespace fs = std::filesystem;

// Epoch 3's notice for a node of two (nproc workers each), its loss fields left to the test.
EpochNotice epoch3_notice(int nproc) {
  EpochNotice n;
  n.epoch = 3;
  n.nnodes = 2;
  n.nproc = nproc;
  n.store_host = "127.0.0.1";
  n.store_port = 7;
  n.store_prefix = "rdzv/j/epoch/3/round/0";
  return n;
}

// A fresh folder for the notice file, removed by the destructor.
struct NoticeDir {
  fs::path dir;
  explicit NoticeDir(const std::string& stem)
      : dir(fs::temp_directory_path() / (stem + std::to_string(::getpid()))) {
    fs::create_directories(dir);
  }
  ~NoticeDir() { fs::remove_all(dir); }
  std::string path() const { return (dir / "epoch").string(); }
};

TEST(EpochNotice, LostAtSurvivesTheFileAndDecidesAgainstTheWorkersOwnEpoch) {
  const NoticeDir dir("weft_notice_");
  const std::string path = dir.path();
  // Epoch 2 renewed epoch 1 (a worker replaced: noted at 2), then epoch 3 formed (a join)
  // before this node's workers read epoch 2's notice: the agent's `lost` against epoch 2 is
  // false, but a worker still in epoch 1 lost a process of its world.
  EpochNotice n = epoch3_notice(2);
  n.lost = false;
  n.lost_at = 2;
  write_epoch_notice(path, n);
  const std::optional<EpochNotice> read = read_epoch_notice(path);
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(read->lost_at, 2);
  EXPECT_FALSE(read->lost);
  EXPECT_TRUE(read->loses_process_of(1)) << "epoch 1's world lost a process in epoch 2";
  EXPECT_FALSE(read->loses_process_of(2)) << "a worker in epoch 2 already left that loss behind";
  EpochWatch watch(path, 1);
  std::optional<EpochNotice> seen = watch.newer();
  ASSERT_TRUE(seen.has_value());
  EXPECT_TRUE(seen->loses_process_of(watch.epoch()));
  // Nothing noted: only the agent's own `lost` says so.
  n.lost_at = 0;
  EXPECT_FALSE(n.loses_process_of(1));
  n.lost = true;
  EXPECT_TRUE(n.loses_process_of(2));
}

// The agent's per-epoch verdicts (lost_since) decide for the epochs they name, exactly;
// lost and lost_at only for a worker in an epoch the agent no longer lists.
TEST(EpochNotice, LostSinceSurvivesTheFileAndDecidesForTheEpochsItNames) {
  const NoticeDir dir("weft_notice_s_");
  const std::string path = dir.path();
  // Epoch 2 admitted a node that died in epoch 3: epoch 2's world lost a process, epoch 1's
  // did not, though the loss was noted at 3 (lost_at 3).
  EpochNotice n = epoch3_notice(1);
  n.lost = true;
  n.lost_at = 3;
  n.lost_since = {{1, false}, {2, true}};
  write_epoch_notice(path, n);
  const std::optional<EpochNotice> read = read_epoch_notice(path);
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(read->lost_since, n.lost_since);
  EXPECT_FALSE(read->loses_process_of(1)) << "the dead node was never in epoch 1's world";
  EXPECT_TRUE(read->loses_process_of(2));
  EXPECT_TRUE(read->loses_process_of(0)) << "an epoch not listed: lost_at decides";
  // A notice without verdicts reads as before.
  n.lost_since.clear();
  write_epoch_notice(path, n);
  EXPECT_TRUE(read_epoch_notice(path)->lost_since.empty());
  EXPECT_TRUE(read_epoch_notice(path)->loses_process_of(1));
  // A malformed list is an error naming the key.
  {
    std::ofstream f(path, std::ios::app);
    f << "lost_since 1:x\n";
  }
  try {
    read_epoch_notice(path);
    ADD_FAILURE() << "a malformed lost_since was read";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("lost_since"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace weft::launch

namespace weft::launch {
namespace {

// NoticeWaiter: a notice written while it waits wakes it (true) well before its long bound;
// with nothing written it returns false when the bound passes. A bound of minutes makes the
// first a test of the wake, not of a clock.
TEST(NoticeWaiter, ANewNoticeWakesItAndNothingElseDoes) {
  const std::string dir = ::testing::TempDir() + "notice_waiter_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/epoch";
  NoticeWaiter waiter(path);
  ASSERT_TRUE(waiter.watching());
  EXPECT_FALSE(waiter.wait(std::chrono::milliseconds(50))) << "woken with nothing written";
  EpochNotice n;
  n.epoch = 2;
  std::thread writer([&] { write_epoch_notice(path, n); });
  EXPECT_TRUE(waiter.wait(std::chrono::minutes(5))) << "the notice did not wake it";
  writer.join();
  std::optional<EpochNotice> read = read_epoch_notice(path);
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(read->epoch, 2);
  std::filesystem::remove_all(dir);
}

// A parked spare's worker takes its restart count ((epoch - 1) + round) from its first notice;
// a notice without one (written by an older agent) says -1: not given.
TEST(EpochNotice, RestartCountSurvivesTheFileAndIsMinusOneWhenAbsent) {
  const NoticeDir dir("weft_notice_rc_");
  const std::string path = dir.path();
  EpochNotice n = epoch3_notice(1);
  n.restart_count = 4;
  write_epoch_notice(path, n);
  std::optional<EpochNotice> read = read_epoch_notice(path);
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(read->restart_count, 4);
  {
    std::ofstream f(path, std::ios::trunc);
    f << "epoch 3\nnode_index 0\nnnodes 2\nnproc 1\nstore_host h\nstore_port 7\n";
  }
  read = read_epoch_notice(path);
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(read->restart_count, -1);
}

}  // namespace
}  // namespace weft::launch
