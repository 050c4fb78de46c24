// The RVD layout's value split under an operator: V-sum (partial sums) and V-max (partial
// maxima, a vocabulary-parallel row max). The search joins a V-max by a max all-reduce and
// never by a sum: no reduce-scatter, no sum all-reduce, no V-sum need met by a V-max.
#include <gtest/gtest.h>

#include <string>

#include "base/error.h"
#include "planner/rvd.h"

namespace weft::planner {
namespace {

const Box kRows = full_box({2, 8, 16});  // (2,b,t): the cross-entropy's sums, or rows of a max
Piece whole() { return Piece{kRows}; }
Piece addend(int i, int n, ReduceOp r) {
  Piece p{kRows, i, n};
  p.reduce = r;
  return p;
}
Piece chunk(int dim, int k, int n) {
  Piece p{kRows};
  p.box[size_t(dim)] = *p.box[size_t(dim)].part(k, n);
  return p;
}
std::vector<std::optional<Piece>> all(const std::vector<Piece>& ps) {
  return std::vector<std::optional<Piece>>(ps.begin(), ps.end());
}
std::vector<Piece> team(int n, ReduceOp r) {
  std::vector<Piece> out;
  for (int i = 0; i < n; ++i) out.push_back(addend(i, n, r));
  return out;
}

TEST(RvdMax, MaxAddendsToReplicatedIsOneMaxAllReduce) {
  CostModel cm;
  for (int tp : {2, 3, 4}) {
    RvdPath p = rvd_search(team(tp, ReduceOp::kMax), all(std::vector<Piece>(size_t(tp), whole())), kRows, 4, cm,
                           false);
    ASSERT_EQ(p.moves.size(), 1u) << tp;
    EXPECT_EQ(p.moves[0].kind, MoveKind::kAllReduce);
    EXPECT_EQ(p.moves[0].reduce, ReduceOp::kMax) << "a V-max joins under max";
    EXPECT_EQ(p.moves[0].factor, tp);
    ASSERT_EQ(p.moves[0].teams.size(), 1u);
    for (const Piece& q : p.moves[0].after) EXPECT_EQ(q, whole()) << "a whole value carries no operator";
  }
  // The same layout under sum stays a sum all-reduce.
  RvdPath s = rvd_search(team(2, ReduceOp::kSum), all({whole(), whole()}), kRows, 4, cm, false);
  ASSERT_EQ(s.moves.size(), 1u);
  EXPECT_EQ(s.moves[0].reduce, ReduceOp::kSum);
}

// Where each member needs a chunk, partial sums are reduce-scattered (cheaper than an
// all-reduce and a cut); partial maxima must not be: a reduce-scatter sums. Ignoring the
// operator would pick the reduce-scatter here.
TEST(RvdMax, MaxAddendsAreNeverReduceScatteredOrSummed) {
  CostModel cm;
  const auto need = all({chunk(2, 0, 2), chunk(2, 1, 2)});
  RvdPath s = rvd_search(team(2, ReduceOp::kSum), need, kRows, 4, cm, false);
  ASSERT_EQ(s.moves.size(), 1u);
  EXPECT_EQ(s.moves[0].kind, MoveKind::kReduceScatter) << "the sum's cheapest path";
  RvdPath m = rvd_search(team(2, ReduceOp::kMax), need, kRows, 4, cm, false);
  ASSERT_FALSE(m.moves.empty());
  int max_reductions = 0;
  for (const Move& mv : m.moves) {
    EXPECT_NE(mv.kind, MoveKind::kReduceScatter) << "a max reduce-scattered by sum";
    if (mv.kind == MoveKind::kAllReduce) {
      EXPECT_EQ(mv.reduce, ReduceOp::kMax) << "a max all-reduced by sum";
      ++max_reductions;
    }
  }
  EXPECT_EQ(max_reductions, 1);
  EXPECT_GT(m.cost, s.cost);
}

// An all-gather moves addends without combining them: a V-max split on a dim gathers into a
// V-max of the whole box, then joins by max.
TEST(RvdMax, MaxAddendsSplitOnADimGatherThenJoinByMax) {
  CostModel cm;
  std::vector<Piece> from;
  for (int v = 0; v < 2; ++v)
    for (int d = 0; d < 2; ++d) {
      Piece p = chunk(1, d, 2);
      p.part = v, p.parts = 2, p.reduce = ReduceOp::kMax;
      from.push_back(p);
    }
  RvdPath p = rvd_search(from, all(std::vector<Piece>(4, whole())), kRows, 4, cm, false);
  for (const Move& mv : p.moves) {
    EXPECT_NE(mv.kind, MoveKind::kReduceScatter);
    if (mv.kind == MoveKind::kAllReduce) {
      EXPECT_EQ(mv.reduce, ReduceOp::kMax);
    }
  }
  ASSERT_FALSE(p.moves.empty());
  for (const Piece& q : p.moves.back().after) EXPECT_EQ(q, whole());
}

// Operators are part of the piece: a V-sum need is not served by V-max addends of the same
// indices (nothing splits a value into addends), and V-max needs are met as they are.
TEST(RvdMax, AMaxAddendIsNotASumAddend) {
  CostModel cm;
  EXPECT_FALSE(piece_extractable(addend(0, 2, ReduceOp::kMax), addend(0, 2, ReduceOp::kSum)));
  EXPECT_TRUE(piece_extractable(addend(0, 2, ReduceOp::kMax), addend(0, 2, ReduceOp::kMax)));
  try {
    rvd_search(team(2, ReduceOp::kMax), all(team(2, ReduceOp::kSum)), kRows, 4, cm, false);
    FAIL() << "V-max addends served as partial sums";
  } catch (const NotSupported& e) {
    EXPECT_NE(std::string(e.what()).find("no layout conversion exists"), std::string::npos) << e.what();
  }
  RvdPath same = rvd_search(team(2, ReduceOp::kMax), all(team(2, ReduceOp::kMax)), kRows, 4, cm, false);
  EXPECT_TRUE(same.moves.empty());
  // Members holding addends of two operators do not form one team.
  try {
    rvd_search({addend(0, 2, ReduceOp::kMax), addend(1, 2, ReduceOp::kSum)}, all({whole(), whole()}), kRows, 4, cm,
               false);
    FAIL() << "a max addend and a sum addend were joined";
  } catch (const NotSupported&) {
  }
}

// Two tensor-parallel teams (two expert-parallel groups, or two data-parallel replicas, on
// other rows) each join their own maxima; across replicas (blocks) the teams stay inside one.
TEST(RvdMax, EachTensorParallelTeamJoinsItsOwnRows) {
  CostModel cm;
  const Box rows = full_box({4, 16});
  auto piece = [&](int half, int i, bool need) {
    Piece p{rows};
    p.box[0] = *p.box[0].part(half, 2);
    if (!need) p.part = i, p.parts = 2, p.reduce = ReduceOp::kMax;
    return p;
  };
  for (int blocks : {1, 2}) {
    RvdPath p = rvd_search({piece(0, 0, false), piece(0, 1, false), piece(1, 0, false), piece(1, 1, false)},
                           all({piece(0, 0, true), piece(0, 1, true), piece(1, 0, true), piece(1, 1, true)}), rows, 4,
                           cm, false, nullptr, blocks);
    ASSERT_EQ(p.moves.size(), 1u) << blocks;
    EXPECT_EQ(p.moves[0].reduce, ReduceOp::kMax);
    EXPECT_EQ(p.moves[0].teams, (std::vector<std::vector<int>>{{0, 1}, {2, 3}})) << blocks;
  }
}

// The memo's key holds the operator: a sum's path is not handed to the same layout under max.
TEST(RvdMax, TheCacheKeepsSumAndMaxApart) {
  CostModel cm;
  RvdCache cache;
  const auto need = all({whole(), whole()});
  RvdPath s = rvd_search(team(2, ReduceOp::kSum), need, kRows, 4, cm, false, &cache);
  RvdPath m = rvd_search(team(2, ReduceOp::kMax), need, kRows, 4, cm, false, &cache);
  EXPECT_EQ(cache.size(), 2u);
  ASSERT_EQ(m.moves.size(), 1u);
  EXPECT_EQ(s.moves[0].reduce, ReduceOp::kSum);
  EXPECT_EQ(m.moves[0].reduce, ReduceOp::kMax);
}

TEST(RvdMax, TheLayoutNamesItsOperator) {
  auto r = rvd_of(team(4, ReduceOp::kMax), kRows);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->str(), "R1 V4max D(1,1,1)");
  EXPECT_EQ(rvd_of(team(4, ReduceOp::kSum), kRows)->str(), "R1 V4 D(1,1,1)");
  EXPECT_EQ(piece_str(addend(1, 2, ReduceOp::kMax)), "[0:2,0:8,0:16]+1/2max");
}

}  // namespace
}  // namespace weft::planner
