// A snapshot slot rewritten while a live move reads it in place (issue 15): two ranks over
// Gloo read their sources as views of their own snapshot slots (checkpoint/snapshot_views.h)
// and swap them through the router (parallel/router.h); rank 0's slot is rewritten from a
// second, writable mapping (as its agent would) right after its first message, so later
// messages send the rewrite's bytes. Every rank must then refuse the moved state
// (checkpoint::agree_slots_unchanged): the reader naming the segment, slot and step, the
// other naming the reader, since the bytes it received are the rewrite's.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "base/error.h"
#include "checkpoint/job_id.h"
#include "checkpoint/snapshot_offers.h"
#include "checkpoint/snapshot_segment.h"
#include "checkpoint/snapshot_views.h"
#include "checkpoint/snapshot_writer.h"
#include "parallel/router.h"
#include "tests/parallel/router_util.h"
#include "tests/support/multiprocess.h"

namespace weft::parallel {
namespace {

using checkpoint::SnapshotMeta;
using checkpoint::SnapshotSegment;
using test_util::fill;
using test_util::mismatches;

// How rank 0's slot is rewritten during the move: not at all, by a writer still in it (its
// sequence 0: torn bytes), or by a newer snapshot committed into it.
enum class Rewrite { kNone, kTorn, kCommitted };

// 32 f32 states of 8 Ki elements, each state's halves swapped between the two ranks; a router
// budget of 64 KiB moves one state per wave, so each rank sends its halves in 32 messages.
constexpr int kStates = 32;
constexpr int64_t kElements = int64_t(8) << 10;
constexpr int64_t kBudget = int64_t(64) << 10;

StateSpace states() {
  core::Graph g;
  for (int i = 0; i < kStates; ++i) {
    core::Value v;
    v.name = "w" + std::to_string(i);
    v.shape = {kElements};
    v.dtype = core::DType::kF32;
    v.role = core::Role::kParameter;
    v.persistent = true;
    g.add_value(v);
  }
  return StateSpace::from_graph(g);
}

// Rank 0 holds the first half of every state in layout A and the second in layout B.
Layout halves(bool swapped) {
  Layout l;
  l.ranks.resize(2);
  for (int r = 0; r < 2; ++r)
    for (int i = 0; i < kStates; ++i) {
      RankLayout& rl = l.ranks[size_t(r)];
      const int64_t start = (r == 0) != swapped ? 0 : kElements / 2;
      rl.locals.push_back(LocalTensor{i, {kElements / 2}, core::DType::kF32, -1});
      rl.boxes.push_back(StateBox{i, {start}, {kElements / 2}, i, {0}});
    }
  return l;
}

class SnapshotRewrittenMoveTest : public ::testing::TestWithParam<Rewrite> {
 protected:
  void TearDown() override {
    for (const std::string& n : checkpoint::snapshot_segments(job_)) SnapshotSegment::unlink(n);
  }
  SnapshotMeta meta(int rank, int64_t step) const {
    SnapshotMeta m;
    m.job_id = job_;
    m.kind = checkpoint::SegmentKind::kData;
    m.owner_node = rank;
    m.epoch = 1;
    m.step = step;
    m.rank = rank;
    m.world = 2;
    m.layout_hash = checkpoint::snapshot_layout_hash(a_.ranks[size_t(rank)]);
    m.payload_bytes = checkpoint::snapshot_payload_bytes(a_.ranks[size_t(rank)]);
    return m;
  }
  std::string name(int rank) const {
    return checkpoint::segment_name(job_, checkpoint::SegmentKind::kData, rank, 1, rank);
  }
  // Rank `rank`'s two-slot segment: its layout-A state as step 10 (the one the move reads:
  // the older slot, the one a writer takes next) and other bytes as step 11.
  void write_two_steps(int rank) const {
    const RankLayout& l = a_.ranks[size_t(rank)];
    (void)SnapshotSegment::create(name(rank), checkpoint::snapshot_payload_bytes(l), ::getpid(), 2);
    checkpoint::SnapshotWriter w(SnapshotSegment::open(name(rank), true));
    std::vector<core::Tensor> state = allocate_locals(l);
    fill(space_, l, state);
    w.start(meta(rank, 10), state);
    ASSERT_TRUE(w.wait().has_value());
    std::vector<core::Tensor> other = allocate_locals(l);
    for (core::Tensor& t : other) std::memset(t.raw_data(), 0x11, t.nbytes());
    w.start(meta(rank, 11), other);
    ASSERT_TRUE(w.wait().has_value());
  }
  // What the node's agent would do to rank 0's step-10 slot (begin() takes the older one).
  void rewrite_slot_of_rank0(Rewrite how) const {
    SnapshotSegment seg = SnapshotSegment::open(name(0), true);
    const SnapshotMeta m = meta(0, 12);
    void* payload = seg.begin(m);
    std::memset(payload, 0x7f, size_t(m.payload_bytes));
    if (how == Rewrite::kCommitted) (void)seg.commit();
  }

  const std::string job_ = checkpoint::new_job_id();
  const StateSpace space_ = states();
  const Layout a_ = halves(false), b_ = halves(true);
};

TEST_P(SnapshotRewrittenMoveTest, EveryRankRefusesTheMovedStateWhenASlotWasRewrittenDuringIt) {
  const Rewrite how = GetParam();
  for (int r = 0; r < 2; ++r) ASSERT_NO_FATAL_FAILURE(write_two_steps(r));
  RouterOptions budget;
  budget.budget_bytes = kBudget;
  const TransferPlan plan = transition(space_, a_, b_, budget);
  ASSERT_GE(plan.waves.size(), 8u) << "the rewrite must come before most of the messages";
  test::RunResult result = test::run_ranks(2, [&](test::RankContext& ctx) {
    test::RankWorld w = test::gloo_world(ctx, "rewritten", std::chrono::milliseconds(30'000));
    const int r = ctx.rank();
    checkpoint::SnapshotOffers offers;
    ASSERT_EQ(offers.add(name(r), job_).size(), 2u);
    std::vector<core::Tensor> src = offers.read(r, 10, a_.ranks[size_t(r)]);
    TransitionOptions to;
    bool rewritten = false;
    to.on_progress = [&](const TransitionStats&) {
      if (r == 0 && how != Rewrite::kNone && !std::exchange(rewritten, true))
        rewrite_slot_of_rank0(how);
    };
    std::vector<core::Tensor> dst = run_transition(plan, a_, b_, r, src, *w.comm, to);
    (void)checkpoint::own_snapshot_views(dst);
    if (how == Rewrite::kNone) {
      EXPECT_NO_THROW(checkpoint::agree_slots_unchanged(offers, w.comm.get()));
      EXPECT_EQ(mismatches(space_, b_.ranks[size_t(r)], dst), 0) << "rank " << r;
      return;
    }
    // The window was real: rank 1 received the rewrite's bytes from rank 0's slot.
    if (r == 1) {
      EXPECT_GT(mismatches(space_, b_.ranks[1], dst), 0);
    }
    try {
      checkpoint::agree_slots_unchanged(offers, w.comm.get());
      ADD_FAILURE() << "rank " << r << " accepted a move from a rewritten slot";
    } catch (const IoError& e) {
      const std::string what = e.what();
      if (r == 0) {
        EXPECT_NE(what.find("snapshot slot 0 of " + name(0) + " (step 10) was rewritten"),
                  std::string::npos)
            << what;
      } else {
        EXPECT_NE(what.find("read by rank(s) 0 was rewritten during the move"), std::string::npos)
            << what;
      }
    }
    // Without its world (the move's connections gone), the reader still finds its own.
    if (r == 0) {
      EXPECT_THROW(checkpoint::agree_slots_unchanged(offers, nullptr), IoError);
    } else {
      EXPECT_NO_THROW(checkpoint::agree_slots_unchanged(offers, nullptr));
    }
  });
  EXPECT_TRUE(result.ok()) << result.summary();
}

INSTANTIATE_TEST_SUITE_P(Rewrites, SnapshotRewrittenMoveTest,
                         ::testing::Values(Rewrite::kNone, Rewrite::kTorn, Rewrite::kCommitted),
                         [](const ::testing::TestParamInfo<Rewrite>& i) {
                           return std::string(i.param == Rewrite::kNone   ? "NotRewritten"
                                              : i.param == Rewrite::kTorn ? "AWriterStillInIt"
                                                                          : "ANewerSnapshot");
                         });

}  // namespace
}  // namespace weft::parallel
