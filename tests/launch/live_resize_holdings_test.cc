// What a rank of a forming world holds and offers: the pieces of layouts a move stopped
// midway leaves (choose_holders covers the state from pieces of two layouts of one step, and
// never from pieces of different steps or epochs), and whether same-step snapshots back what
// it holds (elastic.old_state: keep_unless_backed frees the old state as it moves only then).
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "base/error.h"
#include "launch/live_resize.h"
#include "parallel/router.h"
#include "planner/plan_cache.h"
#include "tests/launch/zero1_spec.h"

namespace weft::launch {
namespace {

HeldState held_at(int64_t epoch, int rank, int world, int64_t step) {
  HeldState h;
  h.valid = true;
  h.epoch = epoch;
  h.rank = rank;
  h.world = world;
  h.step = step;
  h.pieces.push_back(HeldPiece{rank, world, {}, {}});
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
  // What a stopped move left: every piece needs its own slot's snapshot.
  HeldState mixed = held;
  mixed.pieces.push_back(HeldPiece{2, 3, {0, 1}, {}});
  EXPECT_FALSE(snapshot_backs(mixed, {same}));
  EXPECT_TRUE(snapshot_backs(mixed, {same, offer(HolderReport::kSnapshot, 3, 2, 3, 120)}));
}

// A live piece of layout slot (world, rank) of step 7 trained in epoch 1, held by new rank
// `holder` on host 0.
HolderReport piece(int holder, int world, int rank, std::vector<int> locals, int64_t step = 7,
                   int64_t epoch = 1) {
  HolderReport r = offer(HolderReport::kLive, epoch, rank, world, step);
  r.holder = holder;
  r.host = 0;
  r.locals = std::move(locals);
  return r;
}

// The locals of `r` whose state is (or is not) an Adam first moment.
std::vector<int> locals_where(const parallel::StateSpace& space, const parallel::RankLayout& r,
                              bool adam_m) {
  std::vector<int> out;
  for (size_t l = 0; l < r.locals.size(); ++l)
    if ((space.at(r.locals[l].state).kind == parallel::StateKind::kAdamM) == adam_m)
      out.push_back(int(l));
  return out;
}

// The layouts of a dp2 -> dp3 move of the small ZeRO-1 job, and which locals each rank
// holds once the move stopped with the first moments moved: `rest`, the old ranks' other
// locals; `moved`, the new ranks' first moments.
struct StoppedDp2ToDp3 {
  const core::JobSpec spec = zero1_spec();
  planner::PlanCache plans{spec};  // keeps a reference to spec
  const parallel::StateSpace space = parallel::StateSpace::from_graph(plans.graph()->graph);
  const parallel::Layout l2 = parallel::layout_of(space, *plans.plan(2));
  const parallel::Layout l3 = parallel::layout_of(space, *plans.plan(3));
  std::vector<std::vector<int>> rest = locals(l2, false), moved = locals(l3, true);

  std::vector<std::vector<int>> locals(const parallel::Layout& l, bool adam_m) const {
    std::vector<std::vector<int>> out;
    for (const parallel::RankLayout& r : l.ranks) out.push_back(locals_where(space, r, adam_m));
    return out;
  }
};

// A move from dp2 to dp3 stopped midway: the two old ranks have freed their first moments
// (moved) but hold the rest; the first moments have arrived whole on the three ranks of the
// new layout. Neither layout's pieces cover the state; together they do, with nothing read
// from a snapshot, and the router can move them to the new layout.
TEST(ChooseHolders, CoversTheStateFromPiecesOfTwoLayoutsOfOneStep) {
  StoppedDp2ToDp3 m;
  planner::PlanCache& plans = m.plans;
  const parallel::StateSpace& space = m.space;
  const parallel::Layout& l3 = m.l3;
  const std::vector<std::vector<int>>& rest = m.rest;
  const std::vector<std::vector<int>>& moved = m.moved;
  ASSERT_FALSE(moved[2].empty());
  // In exchange_reports' order: each rank's first piece, then the others.
  std::vector<HolderReport> reports = {piece(0, 2, 0, rest[0]), piece(1, 2, 1, rest[1]),
                                       piece(2, 3, 2, moved[2]), piece(0, 3, 0, moved[0]),
                                       piece(1, 3, 1, moved[1])};
  const Holders h = choose_holders(plans, space, reports, 3);
  ASSERT_TRUE(h.found) << h.why_not;
  EXPECT_EQ(h.step, 7);
  EXPECT_EQ(h.epoch, 1);
  EXPECT_TRUE(h.mixed);
  EXPECT_EQ(h.snapshots, 0);
  ASSERT_EQ(h.count(), 5);
  // Layout A: each holder's parts in report order, their boxes those of the listed locals.
  const std::vector<std::pair<int, int>> want = {{0, 0}, {0, 3}, {1, 1}, {1, 4}, {2, 2}};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(h.parts[i].holder, want[i].first) << i;
    EXPECT_EQ(h.parts[i].report, want[i].second) << i;
  }
  EXPECT_EQ(h.a.ranks[0].locals.size(), rest[0].size() + moved[0].size());
  EXPECT_EQ(h.a.ranks[2].locals.size(), moved[2].size());
  for (const parallel::StateBox& b : h.a.ranks[2].boxes)
    EXPECT_EQ(space.at(b.state).kind, parallel::StateKind::kAdamM) << space.at(b.state).name;
  parallel::Layout b3 = l3;
  b3.hosts = {0, 0, 0};
  const parallel::TransferPlan move = parallel::transition(space, h.a, b3);
  EXPECT_GT(move.transfers.size(), 0u);
  // What held_after_move gives back for such a part is what the part listed.
  std::vector<core::Tensor> src(h.a.ranks[2].locals.size());
  src[0] = core::Tensor::zeros({1}, core::DType::kF32);
  const HeldState left = held_after_move(h, reports, 2, src, {}, 3, 2);
  ASSERT_TRUE(left.valid);
  ASSERT_EQ(left.pieces.size(), 1u);
  EXPECT_EQ(left.pieces[0].world, 3);
  EXPECT_EQ(left.pieces[0].locals, std::vector<int>{moved[2][0]});

  // Without the newcomer's piece the first moments it held are nowhere: no holders, naming it.
  std::vector<HolderReport> lacking = reports;
  lacking[2].valid = 0;
  const Holders none = choose_holders(plans, space, lacking, 3);
  EXPECT_FALSE(none.found);
  EXPECT_NE(none.why_not.find("adam_m:"), std::string::npos) << none.why_not;
  // Pieces of another step, or trained in another epoch, are another state: never combined.
  for (HolderReport other : {piece(2, 3, 2, moved[2], 8), piece(2, 3, 2, moved[2], 7, 2)}) {
    std::vector<HolderReport> apart = reports;
    apart[2] = other;
    EXPECT_FALSE(choose_holders(plans, space, apart, 3).found) << other.step << " " << other.epoch;
  }
}

// A destination that a stopped move filled in part (parallel::Arrived) is reported with the
// boxes that arrived: the newcomer of a dp2 -> dp3 move holds one of its first-moment shards
// in two halves. Both halves cover the state with the old layout's pieces; one half alone
// leaves the other on no rank (the planner never takes the rest of that tensor for data); a
// box that is not the slot's is refused. held_after_move reports such a tensor with its
// boxes, and keeps them on a partly held source of a move that stops again.
TEST(ChooseHolders, APartlyFilledDestinationHoldsOnlyItsArrivedBoxes) {
  StoppedDp2ToDp3 m;
  planner::PlanCache& plans = m.plans;
  const parallel::StateSpace& space = m.space;
  const parallel::Layout& l3 = m.l3;
  const std::vector<std::vector<int>>& rest = m.rest;
  const std::vector<std::vector<int>>& moved = m.moved;
  // The newcomer's first box of a first moment whose leading extent splits in two.
  const parallel::RankLayout& slot = l3.ranks[2];
  const parallel::StateBox* box = nullptr;
  for (const parallel::StateBox& b : slot.boxes)
    if (space.at(b.state).kind == parallel::StateKind::kAdamM && !b.extent.empty() &&
        b.extent[0] >= 2 && slot.locals[size_t(b.local)].shape.size() == b.extent.size()) {
      box = &b;
      break;
    }
  ASSERT_NE(box, nullptr);
  int others = 0;  // the slot's other boxes of that local (kept whole)
  for (const parallel::StateBox& b : slot.boxes) others += b.local == box->local && !(b == *box);
  parallel::StateBox lo = *box, hi = *box;
  lo.extent[0] = box->extent[0] / 2;
  hi.extent[0] = box->extent[0] - lo.extent[0];
  hi.start[0] += lo.extent[0], hi.local_start[0] += lo.extent[0];
  std::vector<HolderReport> reports = {piece(0, 2, 0, rest[0]), piece(1, 2, 1, rest[1]),
                                       piece(2, 3, 2, moved[2]), piece(0, 3, 0, moved[0]),
                                       piece(1, 3, 1, moved[1])};
  // The other boxes of the local, whole, then the two halves: the whole local again.
  for (const parallel::StateBox& b : slot.boxes)
    if (b.local == box->local && !(b == *box)) reports[2].partial.push_back(b);
  reports[2].partial.push_back(lo);
  reports[2].partial.push_back(hi);
  const Holders h = choose_holders(plans, space, reports, 3);
  ASSERT_TRUE(h.found) << h.why_not;
  EXPECT_TRUE(h.mixed);
  // The part's boxes of that local: the halves (state and place in the tensor the slot's).
  const auto at = std::find(moved[2].begin(), moved[2].end(), box->local);
  ASSERT_NE(at, moved[2].end());
  const int part_local = int(at - moved[2].begin());
  std::vector<parallel::StateBox> got;
  for (const parallel::StateBox& b : h.a.ranks[2].boxes)
    if (b.local == part_local) got.push_back(b);
  ASSERT_EQ(got.size(), size_t(others) + 2);
  EXPECT_EQ(got[size_t(others)].start, lo.start);
  EXPECT_EQ(got[size_t(others)].extent, lo.extent);
  EXPECT_EQ(got[size_t(others) + 1].local_start, hi.local_start);
  EXPECT_EQ(got[size_t(others) + 1].state, box->state);
  // One half alone: the other is on no rank, so no holders, naming the moment.
  std::vector<HolderReport> half = reports;
  half[2].partial.pop_back();
  const Holders none = choose_holders(plans, space, half, 3);
  EXPECT_FALSE(none.found);
  EXPECT_NE(none.why_not.find("adam_m:"), std::string::npos) << none.why_not;
  // A box outside the slot's boxes of that local, or of a local the piece does not list.
  std::vector<HolderReport> bad = half;
  bad[2].partial.back().local_start[0] += 1;
  EXPECT_THROW(choose_holders(plans, space, bad, 3), InternalError);
  bad = half;
  const std::vector<int> unlisted = locals_where(space, slot, false);
  ASSERT_FALSE(unlisted.empty());
  bad[2].partial.back().local = unlisted[0];
  EXPECT_THROW(choose_holders(plans, space, bad, 3), InternalError);

  // held_after_move: the newcomer's tensors of the new layout, that local with only `lo`.
  parallel::Arrived arrived;
  arrived.tensors.resize(slot.locals.size());
  arrived.partial.resize(slot.locals.size());
  for (size_t l = 0; l < slot.locals.size(); ++l)
    arrived.tensors[l] = core::Tensor::zeros({1}, core::DType::kF32);
  arrived.partial[size_t(box->local)] = {lo};
  std::vector<core::Tensor> src(h.a.ranks[2].locals.size());  // its old part all freed
  HeldState left = held_after_move(h, reports, 2, src, arrived, 3, 2);
  ASSERT_TRUE(left.valid);
  ASSERT_EQ(left.pieces.size(), 1u);
  // Every local is there, one in part: the slot is listed, not held whole.
  EXPECT_EQ(left.pieces[0].locals.size(), slot.locals.size());
  ASSERT_EQ(left.pieces[0].partial.size(), 1u);
  EXPECT_EQ(left.pieces[0].partial[0], lo);
  // All whole: the whole slot (no list), as before.
  arrived.partial[size_t(box->local)].clear();
  left = held_after_move(h, reports, 2, src, arrived, 3, 2);
  ASSERT_EQ(left.pieces.size(), 1u);
  EXPECT_TRUE(left.pieces[0].locals.empty());
  EXPECT_TRUE(left.pieces[0].partial.empty());
  // The next move stops too, the partly held source not yet released: it stays partial.
  src[size_t(part_local)] = core::Tensor::zeros({1}, core::DType::kF32);
  left = held_after_move(h, reports, 2, src, parallel::Arrived{}, 3, 2);
  ASSERT_EQ(left.pieces.size(), 1u);
  EXPECT_EQ(left.pieces[0].locals, std::vector<int>{box->local});
  EXPECT_EQ(left.pieces[0].partial.size(), size_t(others) + 2);
}

// The common case stays what it was: every survivor's whole state is one part, not mixed.
TEST(ChooseHolders, WholeStatesOfOneLayoutAreOnePartEach) {
  const core::JobSpec spec = zero1_spec();
  planner::PlanCache plans(spec);
  const parallel::StateSpace space = parallel::StateSpace::from_graph(plans.graph()->graph);
  std::vector<HolderReport> reports = {piece(0, 2, 0, {}), piece(1, 2, 1, {})};
  HolderReport newcomer = piece(2, 2, -1, {});
  newcomer.valid = 0;
  reports.push_back(newcomer);
  const Holders h = choose_holders(plans, space, reports, 3);
  ASSERT_TRUE(h.found) << h.why_not;
  EXPECT_FALSE(h.mixed);
  EXPECT_EQ(h.count(), 2);
  EXPECT_EQ(h.old_world, 2);
  EXPECT_TRUE(h.a.ranks[2].locals.empty());
}

}  // namespace
}  // namespace weft::launch
