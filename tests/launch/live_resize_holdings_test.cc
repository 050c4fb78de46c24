// What a rank of a forming world may do with the live state it holds: the router frees it as
// it moves only when a committed snapshot of the very same state (epoch, old rank, world,
// step) is offered to the world, so an entry that fails midway loses nothing.
#include <gtest/gtest.h>

#include <vector>

#include "launch/live_resize.h"

namespace weft::launch {
namespace {

HeldState held_at(int64_t epoch, int rank, int world, int64_t step) {
  HeldState h;
  h.valid = true;
  h.epoch = epoch;
  h.rank = rank;
  h.world = world;
  h.step = step;
  return h;
}

HolderReport offer(int64_t source, int64_t epoch, int64_t rank, int64_t world, int64_t step) {
  HolderReport r;
  r.valid = 1;
  r.source = source;
  r.epoch = epoch;
  r.rank = rank;
  r.world = world;
  r.step = step;
  return r;
}

TEST(SnapshotBacks, OnlyASnapshotOfTheSameStateOfTheSameRankBacksIt) {
  const HeldState held = held_at(3, 1, 4, 120);
  // Every kind of snapshot counts: the node's own, a replica, one rebuilt from parity.
  for (int64_t source : {HolderReport::kSnapshot, HolderReport::kReplica, HolderReport::kRebuilt})
    EXPECT_TRUE(snapshot_backs(held, {offer(source, 3, 1, 4, 120)})) << source;
  const HolderReport same = offer(HolderReport::kSnapshot, 3, 1, 4, 120);
  // The rank's own live report, or another rank's live state, is not a backup.
  EXPECT_FALSE(snapshot_backs(held, {offer(HolderReport::kLive, 3, 1, 4, 120)}));
  // A step behind (the next world would redo a step), another rank, epoch or world.
  for (HolderReport r : {offer(HolderReport::kSnapshot, 3, 1, 4, 119),
                         offer(HolderReport::kSnapshot, 3, 2, 4, 120),
                         offer(HolderReport::kSnapshot, 2, 1, 4, 120),
                         offer(HolderReport::kSnapshot, 3, 1, 3, 120)})
    EXPECT_FALSE(snapshot_backs(held, {r})) << r.epoch << " " << r.rank << " " << r.world << " "
                                            << r.step;
  HolderReport invalid = same;
  invalid.valid = 0;
  EXPECT_FALSE(snapshot_backs(held, {invalid}));
  // Among others, in any position.
  EXPECT_TRUE(snapshot_backs(held, {offer(HolderReport::kLive, 3, 0, 4, 120),
                                    offer(HolderReport::kSnapshot, 3, 0, 4, 120), same}));
  // Nothing held (a newcomer, a torn step): nothing to free.
  HeldState torn = held;
  torn.valid = false;
  EXPECT_FALSE(snapshot_backs(torn, {same}));
}

}  // namespace
}  // namespace weft::launch
