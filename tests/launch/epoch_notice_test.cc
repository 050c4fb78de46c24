// The epoch notice's loss fields: what a worker in a given epoch concludes from the newest
// notice, whichever notices before it the worker never read.
#include "launch/epoch_notice.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace weft::launch {
namespace {

namespace fs = std::filesystem;

TEST(EpochNotice, LostAtSurvivesTheFileAndDecidesAgainstTheWorkersOwnEpoch) {
  const fs::path dir = fs::temp_directory_path() / ("weft_notice_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "epoch").string();
  // Epoch 2 renewed epoch 1 (a worker replaced: noted at 2), then epoch 3 formed (a join)
  // before this node's workers read epoch 2's notice: the agent's `lost` against epoch 2 is
  // false, but a worker still in epoch 1 lost a process of its world.
  EpochNotice n;
  n.epoch = 3;
  n.nnodes = 2;
  n.nproc = 2;
  n.store_host = "127.0.0.1";
  n.store_port = 7;
  n.store_prefix = "rdzv/j/epoch/3/round/0";
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
  fs::remove_all(dir);
}

}  // namespace
}  // namespace weft::launch
