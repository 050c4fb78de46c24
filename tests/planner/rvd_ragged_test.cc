// The layout search's ragged dim (MoE routing): rows whose split over destinations is known
// only at run time are regrouped by all_to_all_v, D over the source rows <-> D over the
// destinations; nothing else moves or cuts them.
#include <gtest/gtest.h>

#include <string>

#include "base/error.h"
#include "planner/rvd.h"

namespace weft::planner {
namespace {

// f lanes, each routing `rows` rows of `cols` channels: the team's rows are [0, f rows), and
// lane e's rows bound for lane u are rows [e rows + u q, + q) with q = rows / f under
// uniform routing.
struct Team {
  int64_t f, rows, cols;
  Box whole() const { return full_box({f * rows, cols}); }
  Piece sent(int64_t e) const {  // lane e's own rows, grouped by destination
    return Piece{Box{DimSlice{e * rows, rows, 1, 0}, DimSlice{0, cols, 1, 0}}};
  }
  Piece received(int64_t u) const {  // every lane's rows bound for u, source-major
    const int64_t q = rows / f;
    return Piece{Box{DimSlice{u * q, q, f, rows}.normalised(), DimSlice{0, cols, 1, 0}}};
  }
  GroupLayout senders() const {
    GroupLayout l;
    for (int64_t e = 0; e < f; ++e) l.push_back(sent(e));
    return l;
  }
  std::vector<std::optional<Piece>> receivers() const {
    std::vector<std::optional<Piece>> l;
    for (int64_t u = 0; u < f; ++u) l.push_back(received(u));
    return l;
  }
};

TEST(RvdRagged, DispatchIsOneAllToAllVOverTheTeamAtTheRoutedRowsCost) {
  CostModel cm;
  for (int64_t f : {2, 4}) {
    SCOPED_TRACE(f);
    Team t{f, 8, 6};
    RvdPath p = rvd_search(t.senders(), t.receivers(), t.whole(), 4, cm, false, nullptr, 1, 0);
    ASSERT_EQ(p.moves.size(), 1u);
    const Move& mv = p.moves[0];
    EXPECT_EQ(mv.kind, MoveKind::kAllToAllV);
    EXPECT_EQ(move_collective(mv.kind), CollKind::kAllToAllV);
    EXPECT_EQ(mv.dim, 0);
    EXPECT_EQ(mv.dim2, -1);
    EXPECT_EQ(mv.groups, 1);
    EXPECT_EQ(mv.factor, int(f));
    ASSERT_EQ(mv.teams.size(), 1u);
    std::vector<int> members;
    for (int e = 0; e < int(f); ++e) members.push_back(e);
    EXPECT_EQ(mv.teams[0], members);  // in source order: member u receives block u
    for (int64_t u = 0; u < f; ++u) EXPECT_EQ(mv.after[size_t(u)], t.received(u));
    // Under uniform routing a lane receives as many rows as it sends: the cost is that of
    // one all_to_all_v of a lane's routed rows, and no local copy follows.
    const int64_t bytes = t.rows * t.cols * 4;
    EXPECT_DOUBLE_EQ(mv.cost, cm.collective(CollKind::kAllToAllV, int(f), bytes, false));
    EXPECT_NEAR(p.cost, mv.cost, 1e-6);
  }
}

TEST(RvdRagged, ReturnIsTheDispatchReversed) {
  CostModel cm;
  Team t{4, 8, 6};
  GroupLayout from;
  for (const auto& p : t.receivers()) from.push_back(*p);
  const GroupLayout senders = t.senders();
  std::vector<std::optional<Piece>> need(senders.begin(), senders.end());
  RvdPath p = rvd_search(from, need, t.whole(), 4, cm, false, nullptr, 1, 0);
  ASSERT_EQ(p.moves.size(), 1u);
  EXPECT_EQ(p.moves[0].kind, MoveKind::kAllToAllV);
  for (int64_t e = 0; e < t.f; ++e) EXPECT_EQ(p.moves[0].after[size_t(e)], t.sent(e));
}

// Tensor-parallel replicas of the routed rows (lane = tp index + tp x ep index): each tp
// index exchanges within its own ep team, as the hand rule's teams did.
TEST(RvdRagged, ReplicasExchangeWithinTheirOwnTeams) {
  CostModel cm;
  Team t{2, 8, 6};
  GroupLayout from{t.sent(0), t.sent(0), t.sent(1), t.sent(1)};
  std::vector<std::optional<Piece>> need{t.received(0), t.received(0), t.received(1),
                                         t.received(1)};
  RvdPath p = rvd_search(from, need, t.whole(), 4, cm, false, nullptr, 1, 0);
  ASSERT_EQ(p.moves.size(), 1u);
  EXPECT_EQ(p.moves[0].kind, MoveKind::kAllToAllV);
  ASSERT_EQ(p.moves[0].teams.size(), 2u);
  EXPECT_EQ(p.moves[0].teams[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(p.moves[0].teams[1], (std::vector<int>{1, 3}));
}

// Without the ragged dim the same layouts are a static regrouping no move of the search
// makes (an all_to_all splits one dim into another), and with it nothing but all_to_all_v
// moves the rows: a need of all rows (a gather) or of a sub-range (a cut) has no path.
TEST(RvdRagged, RowsKnownOnlyAtRunTimeAreNeverGatheredOrCut) {
  CostModel cm;
  Team t{2, 8, 6};
  auto refused = [&](const std::vector<std::optional<Piece>>& need, int ragged) {
    try {
      rvd_search(t.senders(), need, t.whole(), 4, cm, false, nullptr, 1, ragged);
      return std::string();
    } catch (const NotSupported& e) {
      return std::string(e.what());
    }
  };
  const Piece all_rows{t.whole()};
  EXPECT_NE(refused({all_rows, all_rows}, 0).find("no layout conversion exists"),
            std::string::npos);
  Piece half = t.sent(0);
  half.box[0].size /= 2;
  EXPECT_NE(refused({half, std::nullopt}, 0).find("no layout conversion exists"),
            std::string::npos);
  // The same need on a static dim is a gather, found at once.
  EXPECT_EQ(refused({all_rows, all_rows}, -1), "");
  // And the dispatch's need on a static dim: the rows are not sized by routing there, and
  // the search keeps to the moves it had (gather, then a local cut), never all_to_all_v.
  RvdPath stat = rvd_search(t.senders(), t.receivers(), t.whole(), 4, cm, false);
  for (const Move& mv : stat.moves) EXPECT_NE(mv.kind, MoveKind::kAllToAllV);
}

// Over data-parallel replicas (blocks) a team must be one a group family names: here the
// same position of each replica, block-major.
TEST(RvdRagged, TeamsAcrossReplicasTakeTheSamePositionOfEach) {
  CostModel cm;
  Team t{2, 8, 6};
  GroupLayout from{t.sent(0), t.sent(0), t.sent(1), t.sent(1)};
  std::vector<std::optional<Piece>> need{t.received(0), t.received(0), t.received(1),
                                         t.received(1)};
  RvdPath p = rvd_search(from, need, t.whole(), 4, cm, false, nullptr, 2, 0);
  ASSERT_EQ(p.moves.size(), 1u);
  EXPECT_EQ(p.moves[0].teams[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(p.moves[0].teams[1], (std::vector<int>{1, 3}));
}

// The rows go to the lanes of the sender's own team: a need that only another team's
// exchange would serve (member 2 asks for block 1, which its team hands to member 3) has no
// path, and the search says so rather than giving up.
TEST(RvdRagged, ANeedOfAnotherTeamsBlockIsRefused) {
  CostModel cm;
  Team t{2, 8, 6};
  GroupLayout from{t.sent(0), t.sent(1), t.sent(0), t.sent(1)};
  std::vector<std::optional<Piece>> need{t.received(0), t.received(1), t.received(1),
                                         t.received(0)};
  try {
    rvd_search(from, need, t.whole(), 4, cm, false, nullptr, 1, 0);
    FAIL() << "a path handed member 2 the block of member 3";
  } catch (const NotSupported& e) {
    EXPECT_NE(std::string(e.what()).find("no layout conversion exists"), std::string::npos)
        << e.what();
  }
}

TEST(RvdRagged, TheCacheKeepsRaggedAndStaticSearchesApart) {
  CostModel cm;
  RvdCache cache;
  Team t{2, 8, 6};
  const Piece all_rows{t.whole()};
  RvdPath s = rvd_search(t.senders(), {all_rows, all_rows}, t.whole(), 4, cm, false, &cache);
  EXPECT_EQ(s.moves.size(), 1u);
  EXPECT_THROW(rvd_search(t.senders(), {all_rows, all_rows}, t.whole(), 4, cm, false, &cache, 1, 0),
               NotSupported);
  EXPECT_EQ(cache.size(), 1u);
}

}  // namespace
}  // namespace weft::planner
