// Phase 3's layout search: the cheapest collectives between RVD layouts.
#include <gtest/gtest.h>

#include <string>

#include "base/error.h"
#include "planner/rvd.h"

namespace weft::planner {
namespace {

const Box kWhole = full_box({4, 8, 16});
Piece whole_piece() { return Piece{kWhole}; }
Piece partial(int i, int n) { return Piece{kWhole, i, n}; }
Piece chunk(int dim, int k, int n) {
  Piece p{kWhole};
  p.box[size_t(dim)] = *p.box[size_t(dim)].part(k, n);
  return p;
}
std::vector<std::optional<Piece>> all(const std::vector<Piece>& ps) {
  return std::vector<std::optional<Piece>>(ps.begin(), ps.end());
}

TEST(Rvd, PartialToReplicatedIsOneAllReduce) {
  CostModel cm;
  RvdPath p = rvd_search({partial(0, 4), partial(1, 4), partial(2, 4), partial(3, 4)},
                         all({whole_piece(), whole_piece(), whole_piece(), whole_piece()}), kWhole, 4, cm, false);
  ASSERT_EQ(p.moves.size(), 1u);
  EXPECT_EQ(p.moves[0].kind, MoveKind::kAllReduce);
  EXPECT_EQ(p.moves[0].teams.size(), 1u);
  EXPECT_EQ(p.moves[0].factor, 4);
}

TEST(Rvd, PartialToSplitIsReduceScatterAlignedToTheNeed) {
  CostModel cm;
  // Member i needs chunk 3-i of dim 2: the reduce-scatter hands out chunks in that order.
  RvdPath p = rvd_search({partial(0, 4), partial(1, 4), partial(2, 4), partial(3, 4)},
                         all({chunk(2, 3, 4), chunk(2, 2, 4), chunk(2, 1, 4), chunk(2, 0, 4)}), kWhole, 4, cm,
                         false);
  ASSERT_EQ(p.moves.size(), 1u);
  EXPECT_EQ(p.moves[0].kind, MoveKind::kReduceScatter);
  EXPECT_EQ(p.moves[0].after[0], chunk(2, 3, 4));
  EXPECT_EQ(p.moves[0].teams[0], (std::vector<int>{3, 2, 1, 0}));  // members in chunk order
  // Cheaper than all-reduce then cut.
  double ar = cm.collective(CollKind::kAllReduce, 4, 4 * 8 * 16 * 4, false);
  EXPECT_LT(p.cost, ar);
}

TEST(Rvd, SplitToReplicatedIsAllGatherAndSplitToSplitIsAllToAll) {
  CostModel cm;
  RvdPath g = rvd_search({chunk(1, 0, 2), chunk(1, 1, 2)}, all({whole_piece(), whole_piece()}), kWhole, 4, cm,
                         false);
  ASSERT_EQ(g.moves.size(), 1u);
  EXPECT_EQ(g.moves[0].kind, MoveKind::kAllGather);
  EXPECT_EQ(g.moves[0].dim, 1);
  RvdPath a = rvd_search({chunk(1, 0, 2), chunk(1, 1, 2)}, all({chunk(2, 0, 2), chunk(2, 1, 2)}), kWhole, 4, cm,
                         false);
  ASSERT_EQ(a.moves.size(), 1u);
  EXPECT_EQ(a.moves[0].kind, MoveKind::kAllToAll);
  EXPECT_EQ(a.moves[0].dim, 1);
  EXPECT_EQ(a.moves[0].dim2, 2);
}

TEST(Rvd, ReplicatedToSplitNeedsNoCommunication) {
  CostModel cm;
  RvdPath p = rvd_search({whole_piece(), whole_piece()}, all({chunk(0, 1, 2), chunk(0, 0, 2)}), kWhole, 4, cm, false);
  EXPECT_TRUE(p.moves.empty());  // each member cuts its piece locally
  EXPECT_GT(p.cost, 0);
}

// One cache shared by searches under two cost models that differ only in a CPU field (a
// fixed cost per local instruction): each must get its own costs, not the first model's
// (the key used to leave op_overhead, cores and the sharing terms out).
TEST(Rvd, ASearchUnderAnotherCostModelGetsItsOwnCosts) {
  CostModel gpu;
  CostModel cpu = gpu;
  cpu.op_overhead = 0.5;
  const auto from = std::vector<Piece>{whole_piece(), whole_piece()};
  const auto need = all({chunk(0, 1, 2), chunk(0, 0, 2)});
  RvdCache cache;
  RvdPath a = rvd_search(from, need, kWhole, 4, gpu, false, &cache);
  RvdPath b = rvd_search(from, need, kWhole, 4, cpu, false, &cache);
  EXPECT_EQ(cache.size(), 2u) << "one entry per cost model";
  EXPECT_LT(a.cost, 0.01) << "a local cut of 1 KiB at the GPU model's memory bandwidth";
  EXPECT_GE(b.cost, 0.5) << "the local cut pays op_overhead under the CPU model";
  RvdPath again = rvd_search(from, need, kWhole, 4, gpu, false, &cache);
  EXPECT_EQ(again.cost, a.cost) << "the first model's entry is still its own";
  EXPECT_EQ(cache.size(), 2u) << "the repeated search was a hit";
}

// The memo belongs to a planner: two planners (two caches) with different cost models keep
// entries of their own, and a search without a cache keeps nothing anywhere.
TEST(Rvd, TwoPlannersWithDifferentCostModelsDoNotShareEntries) {
  CostModel gpu;
  CostModel cpu = gpu;
  cpu.bw_intra = gpu.bw_intra / 100;
  const auto from = std::vector<Piece>{chunk(1, 0, 2), chunk(1, 1, 2)};
  const auto need = all({whole_piece(), whole_piece()});
  RvdCache first, second;
  RvdPath a = rvd_search(from, need, kWhole, 4, gpu, false, &first);
  EXPECT_EQ(first.size(), 1u);
  EXPECT_EQ(second.size(), 0u) << "the second planner sees nothing of the first one's search";
  RvdPath b = rvd_search(from, need, kWhole, 4, cpu, false, &second);
  EXPECT_EQ(first.size(), 1u);
  EXPECT_EQ(second.size(), 1u);
  EXPECT_GT(b.cost, a.cost) << "the second planner's costs are its cost model's";
  RvdPath c = rvd_search(from, need, kWhole, 4, cpu, false);  // no cache
  EXPECT_EQ(c.cost, b.cost);
  EXPECT_EQ(first.size() + second.size(), 2u);
}

// A need no sequence of moves can serve: the search tries every reachable layout and says
// that no conversion exists, which is not the same as giving up at its budget.
TEST(Rvd, AnImpossibleNeedSaysNoConversionExistsNotThatTheSearchGaveUp) {
  CostModel cm;
  // Value parts are only ever reduced, never made: a third of a sum cannot come from halves.
  try {
    rvd_search({partial(0, 2), partial(1, 2)}, all({partial(0, 3), partial(1, 3)}), kWhole, 4, cm,
               false);
    FAIL() << "a conversion into thirds of a sum was found";
  } catch (const NotSupported& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("no layout conversion exists"), std::string::npos) << what;
    EXPECT_EQ(what.find("gave up"), std::string::npos) << what;
  }
}

TEST(Rvd, StridedHeadsLayoutConvertsToContiguous) {
  CostModel cm;
  Box w = full_box({2, 192});
  auto heads = [&](int k) {
    Piece p{w};
    p.box[1] = *p.box[1].part(k, 2, 3);
    return p;
  };
  auto cols = [&](int k) {
    Piece p{w};
    p.box[1] = *p.box[1].part(k, 2, 1);
    return p;
  };
  RvdPath p = rvd_search({heads(0), heads(1)}, {cols(0), cols(1)}, w, 4, cm, false);
  ASSERT_FALSE(p.moves.empty());
  EXPECT_EQ(p.moves[0].kind, MoveKind::kAllGather);
  EXPECT_EQ(p.moves[0].groups, 3);
  EXPECT_EQ(p.moves.back().after[0].box[1], (DimSlice{0, 192, 1, 0}));
}

TEST(Rvd, DescriptorCountsReplicasPartialsAndSplits) {
  auto r = rvd_of({chunk(2, 0, 2), chunk(2, 1, 2), chunk(2, 0, 2), chunk(2, 1, 2)}, kWhole);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->r, 2);
  EXPECT_EQ(r->v, 1);
  EXPECT_EQ(r->d, (std::vector<int64_t>{1, 1, 2}));
  EXPECT_EQ(r->str(), "R2 V1 D(1,1,2)");
}

TEST(Rvd, ReplicasOfPartialsReduceWithinTheirOwnTeams) {
  CostModel cm;
  // Two replicas of each of two partial sums: two all-reduces of two members each, one
  // member per addend (never summing a replica twice).
  RvdPath p = rvd_search({partial(0, 2), partial(1, 2), partial(0, 2), partial(1, 2)},
                         all({whole_piece(), whole_piece(), whole_piece(), whole_piece()}), kWhole, 4, cm, false);
  ASSERT_EQ(p.moves.size(), 1u);
  EXPECT_EQ(p.moves[0].kind, MoveKind::kAllReduce);
  ASSERT_EQ(p.moves[0].teams.size(), 2u);
  EXPECT_EQ(p.moves[0].teams[0].size(), 2u);
}

}  // namespace
}  // namespace weft::planner
