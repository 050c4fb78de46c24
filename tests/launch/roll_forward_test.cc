// Which ranks of a forming world finish the step they stopped before its update
// (launch/roll_forward.h): two ranks as two threads of this process on a loopback store, both
// survivors of a ZeRO-1 world (each holds a moment shard nobody else has). The rank behind
// rolls only when a rank of the same epoch holds the next step with the records of the
// unfinished one and the next step's holders then cover the state; it then gets the rank
// ahead's records and every rank's reports say the next step for it.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "launch/live_resize.h"
#include "launch/roll_forward.h"
#include "planner/plan_cache.h"
#include "tests/launch/world_threads.h"
#include "tests/launch/zero1_spec.h"

namespace weft::launch {
namespace {

class RollForwardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    plans_ = std::make_unique<planner::PlanCache>(spec_);  // keeps a reference to it
    space_ = std::make_unique<parallel::StateSpace>(
        parallel::StateSpace::from_graph(plans_->graph()->graph));
  }

  // Old rank `rank` of a world of `world` (epoch 3): at `step`, unfinished or with records.
  static HeldState held(int rank, int world, int64_t step, int64_t unfinished,
                        int64_t records_step) {
    HeldState h;
    h.valid = true, h.epoch = 3, h.rank = rank, h.world = world, h.step = step;
    h.pieces.push_back(HeldPiece{rank, world, {}, {}, {}});
    h.unfinished = unfinished;
    h.records_step = records_step;
    if (records_step >= 0) h.records = {-1, 0, 1, 2.5, -2, 0, 1, 0.75};
    return h;
  }

  struct Seen {
    RollForward roll;
    std::vector<HolderReport> reports;
  };

  // Both ranks exchange their reports and decide; what each saw.
  std::vector<Seen> run(const HeldState& h0, const HeldState& h1) {
    std::vector<Seen> seen(2);
    const std::vector<std::string> error =
        run_world_threads(2, 4, [&](int rank, comm::Communicator& world) {
          const HeldState& mine = rank == 0 ? h0 : h1;
          Seen& s = seen[size_t(rank)];
          s.reports = exchange_reports(world, mine, 100);
          s.roll = roll_forward(*plans_, *space_, s.reports, 2, world, mine);
        });
    EXPECT_TRUE(error[0].empty()) << error[0];
    EXPECT_TRUE(error[1].empty()) << error[1];
    return seen;
  }

  const core::JobSpec spec_ = zero1_spec();
  std::unique_ptr<planner::PlanCache> plans_;
  std::unique_ptr<parallel::StateSpace> space_;
};

TEST_F(RollForwardTest, TheRankBehindGetsTheRecordsOfTheRankAheadAndReportsTheNextStep) {
  const HeldState ahead = held(0, 2, 8, -1, 7), behind = held(1, 2, 7, 7, -1);
  const std::vector<Seen> seen = run(ahead, behind);
  for (int rank = 0; rank < 2; ++rank) {
    const Seen& s = seen[size_t(rank)];
    EXPECT_EQ(s.roll.step, 7) << "rank " << rank;
    EXPECT_EQ(s.roll.ranks, std::vector<int>{1}) << "rank " << rank;
    EXPECT_EQ(s.roll.source, 0) << "rank " << rank;
    EXPECT_EQ(s.roll.mine, rank == 1);
    ASSERT_GE(s.reports.size(), 2u);
    EXPECT_EQ(s.reports[0].step, 8);
    EXPECT_EQ(s.reports[1].step, 8) << "rank " << rank << ": the rank behind reports step 8";
    const Holders h = choose_holders(*plans_, *space_, s.reports, 2);
    EXPECT_TRUE(h.found);
    EXPECT_EQ(h.step, 8);
    EXPECT_EQ(h.count(), 2);
  }
  EXPECT_EQ(seen[1].roll.records, ahead.records);
  EXPECT_TRUE(seen[0].roll.records.empty());
}

// Without the records (the rank ahead got through the exchange in an older epoch's world, or
// kept none), or with the rank ahead of another epoch, nobody rolls: the reports stay.
TEST_F(RollForwardTest, NoRollWithoutARankAheadThatKeptTheRecords) {
  for (const HeldState& ahead : {held(0, 2, 8, -1, -1), held(0, 2, 8, -1, 6)}) {
    const std::vector<Seen> seen = run(ahead, held(1, 2, 7, 7, -1));
    for (const Seen& s : seen) {
      EXPECT_EQ(s.roll.step, -1);
      EXPECT_FALSE(s.roll.mine);
      ASSERT_GE(s.reports.size(), 2u);
      EXPECT_EQ(s.reports[1].step, 7);
    }
  }
  HeldState other_epoch = held(0, 2, 8, -1, 7);
  other_epoch.epoch = 2;
  for (const Seen& s : run(other_epoch, held(1, 2, 7, 7, -1))) EXPECT_EQ(s.roll.step, -1);
}

// Survivors of a world of 3 (ZeRO-1 dp3): old ranks 0 and 1 hold two thirds of the moments. The
// next step's holders would not cover the state, so the rank behind keeps its step (a
// snapshot or checkpoint group of its step may still need it).
TEST_F(RollForwardTest, NoRollWhenTheNextStepsHoldersWouldNotCoverTheState) {
  const std::vector<Seen> seen = run(held(0, 3, 8, -1, 7), held(1, 3, 7, 7, -1));
  for (const Seen& s : seen) {
    EXPECT_EQ(s.roll.step, -1);
    ASSERT_GE(s.reports.size(), 2u);
    EXPECT_EQ(s.reports[1].step, 7);
  }
}

}  // namespace
}  // namespace weft::launch
