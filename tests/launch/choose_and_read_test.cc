// The holders' choice with the snapshot reads and the vote (launch/live_resize.h,
// choose_and_read): two ranks of a forming world as two threads of this process on a
// loopback store, offering snapshots of a ZeRO-1 dp2 state that nobody holds live. A chosen
// snapshot whose read fails is voted out on both ranks alike, and the world chooses again:
// the replica of that step, then an older step, then nothing (the durable checkpoint). A
// part chosen again is never read again, and the log line says what failed and where the
// state comes from instead.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "checkpoint/snapshot_writer.h"
#include "comm/store/tcp_store_server.h"
#include "launch/live_resize.h"
#include "parallel/launch_env.h"
#include "planner/plan_cache.h"
#include "tests/launch/world_threads.h"
#include "tests/launch/zero1_spec.h"

namespace weft::launch {
namespace {

using namespace std::chrono_literals;

// What one rank saw: its choice, the reports it read (in order), what it got, its notes.
struct RankResult {
  Holders holders;
  std::vector<int> reads;
  std::map<int, std::vector<core::Tensor>> got;
  std::vector<std::string> notes;
  std::string error;
};

class ChooseAndRead : public ::testing::Test {
 protected:
  void SetUp() override {
    plans_ = std::make_unique<planner::PlanCache>(spec_);  // keeps a reference to it
    space_ = std::make_unique<parallel::StateSpace>(
        parallel::StateSpace::from_graph(plans_->graph()->graph));
    const parallel::Layout l2 = parallel::layout_of(*space_, *plans_->plan(2));
    // In exchange_reports' order: the two ranks' live reports (nothing held: both lost their
    // state), then their offers. Rank 0's node took both old ranks' snapshots, of steps 7 and
    // 6; rank 1's node holds a replica of old rank 1's step 7.
    for (int r = 0; r < 2; ++r) {
      HolderReport live;
      live.valid = 0;
      live.holder = r;
      reports_.push_back(live);
    }
    auto snap = [&](int64_t source, int rank, int64_t step, int holder) {
      HolderReport o;
      o.valid = 1;
      o.source = source;
      o.epoch = 1;
      o.rank = rank;
      o.world = 2;
      o.step = step;
      o.holder = holder;
      o.layout_hash = int64_t(checkpoint::snapshot_layout_hash(l2.ranks[size_t(rank)]));
      reports_.push_back(o);
    };
    snap(HolderReport::kSnapshot, 0, 7, 0);  // 2
    snap(HolderReport::kSnapshot, 1, 7, 0);  // 3
    snap(HolderReport::kReplica, 1, 7, 1);   // 4
    snap(HolderReport::kSnapshot, 0, 6, 0);  // 5
    snap(HolderReport::kSnapshot, 1, 6, 0);  // 6
  }

  // Both ranks choose and read, the reads of `corrupt` reports failing with an IoError.
  std::vector<RankResult> run(const std::set<int>& corrupt) {
    std::vector<RankResult> out(2);
    const std::vector<std::string> errors =
        run_world_threads(2, 2, [&](int rank, comm::Communicator& world) {
          RankResult& me = out[size_t(rank)];
          std::vector<HolderReport> reports = reports_;
          ReadSnapshot read = [&](const HolderReport& r, const Holders::Part& p, int64_t step) {
            const int q = int(&r - reports.data());
            me.reads.push_back(q);
            EXPECT_EQ(r.step, step);
            EXPECT_EQ(p.holder, rank);
            if (corrupt.count(q))
              throw IoError("snapshot slot 1 of /test-r" + std::to_string(r.rank) +
                            " not read: 1 corrupt block(s)");
            return std::vector<core::Tensor>{core::Tensor::from_vector<int64_t>({1}, {q})};
          };
          me.holders =
              choose_and_read(*plans_, *space_, reports, 2, world, read, me.got, &me.notes);
        });
    for (int r = 0; r < 2; ++r) out[size_t(r)].error = errors[size_t(r)];
    return out;
  }

  // The (report, holder) pairs of a choice.
  static std::vector<std::pair<int, int>> parts(const Holders& h) {
    std::vector<std::pair<int, int>> v;
    for (const Holders::Part& p : h.parts) v.emplace_back(p.report, p.holder);
    return v;
  }

  // Both ranks chose alike, and each got exactly its own snapshot parts, the right reports.
  static void expect_consistent(const std::vector<RankResult>& res) {
    for (const RankResult& r : res) ASSERT_TRUE(r.error.empty()) << r.error;
    EXPECT_EQ(res[0].holders.found, res[1].holders.found);
    EXPECT_EQ(res[0].holders.step, res[1].holders.step);
    EXPECT_EQ(parts(res[0].holders), parts(res[1].holders));
    EXPECT_EQ(res[0].notes, res[1].notes);
    for (int rank = 0; rank < 2; ++rank) {
      std::set<int> want, have;
      for (const Holders::Part& p : res[size_t(rank)].holders.parts)
        if (p.holder == rank) want.insert(p.report);
      for (const auto& [q, t] : res[size_t(rank)].got) {
        have.insert(q);
        ASSERT_EQ(t.size(), 1u);
        EXPECT_EQ(t[0].data<int64_t>()[0], q);
      }
      EXPECT_EQ(have, want) << "rank " << rank;
    }
  }

  const core::JobSpec spec_ = zero1_spec();
  std::unique_ptr<planner::PlanCache> plans_;
  std::unique_ptr<parallel::StateSpace> space_;
  std::vector<HolderReport> reports_;
};

TEST_F(ChooseAndRead, IntactSnapshotsAreReadOnceByTheirHoldersAndNothingIsVotedOut) {
  const std::vector<RankResult> res = run({});
  ASSERT_NO_FATAL_FAILURE(expect_consistent(res));
  EXPECT_TRUE(res[0].holders.found);
  EXPECT_EQ(res[0].holders.step, 7);
  EXPECT_EQ(res[0].holders.replicas, 0);  // the node's own snapshots first
  EXPECT_EQ(res[0].reads, (std::vector<int>{2, 3}));
  EXPECT_TRUE(res[1].reads.empty());
  EXPECT_TRUE(res[0].notes.empty());
}

// Old rank 1's own snapshot of step 7 is corrupt: the replica of step 7 serves instead, and
// old rank 0's snapshot, read in the first round, is not read again.
TEST_F(ChooseAndRead, ACorruptOwnSnapshotIsReplacedByTheReplicaOfTheSameStep) {
  const std::vector<RankResult> res = run({3});
  ASSERT_NO_FATAL_FAILURE(expect_consistent(res));
  ASSERT_TRUE(res[0].holders.found);
  EXPECT_EQ(res[0].holders.step, 7);
  EXPECT_EQ(res[0].holders.replicas, 1);
  EXPECT_EQ(parts(res[0].holders), (std::vector<std::pair<int, int>>{{2, 0}, {4, 1}}));
  EXPECT_EQ(res[0].reads, (std::vector<int>{2, 3}));
  EXPECT_EQ(res[1].reads, (std::vector<int>{4}));
  ASSERT_EQ(res[0].notes.size(), 1u);
  const std::string& n = res[0].notes[0];
  EXPECT_NE(n.find("snapshot(s) of step 7 chosen for this world failed their read (old rank 1's "
                   "(world 2) the node's own on rank 0;"),
            std::string::npos)
      << n;
  EXPECT_NE(n.find("chose again without them: step 7 (epoch 1) from 2 holders, 2 of them "
                   "in-memory snapshots (1 own, 1 replica(s), 0 rebuilt from parity)"),
            std::string::npos)
      << n;
}

// Step 7's replica is corrupt too: step 6, which old rank 0's node has whole, serves; the
// step-7 read of old rank 0 is dropped.
TEST_F(ChooseAndRead, WhenEveryCopyOfAStepFailsAnOlderStepServes) {
  const std::vector<RankResult> res = run({3, 4});
  ASSERT_NO_FATAL_FAILURE(expect_consistent(res));
  ASSERT_TRUE(res[0].holders.found);
  EXPECT_EQ(res[0].holders.step, 6);
  EXPECT_EQ(res[0].reads, (std::vector<int>{2, 3, 5, 6}));
  EXPECT_EQ(res[1].reads, (std::vector<int>{4}));
  ASSERT_EQ(res[0].notes.size(), 2u);
  EXPECT_NE(res[0].notes[1].find("old rank 1's (world 2) a replica on rank 1;"), std::string::npos)
      << res[0].notes[1];
  EXPECT_NE(res[0].notes[1].find("chose again without them: step 6 (epoch 1)"), std::string::npos)
      << res[0].notes[1];
}

// Nothing in memory covers the state once step 6's snapshot of old rank 0 fails as well:
// not found, and the line sends the job to the durable checkpoint.
TEST_F(ChooseAndRead, WhenNoSnapshotIsLeftTheChoiceGoesToTheDurableCheckpoint) {
  const std::vector<RankResult> res = run({3, 4, 5});
  ASSERT_NO_FATAL_FAILURE(expect_consistent(res));
  EXPECT_FALSE(res[0].holders.found);
  EXPECT_TRUE(res[0].got.empty());
  ASSERT_EQ(res[0].notes.size(), 3u);
  EXPECT_NE(res[0].notes[2].find("no other source in memory covers the state ("),
            std::string::npos)
      << res[0].notes[2];
  EXPECT_NE(res[0].notes[2].find("from the durable checkpoint under checkpoint.dir"),
            std::string::npos)
      << res[0].notes[2];
}

}  // namespace
}  // namespace weft::launch
