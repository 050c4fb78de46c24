// Phase 3's layout search over many data-parallel blocks: a gradient summed over dp replicas
// of ep lanes (128 x 4 at world 512). The A* bound (planner/rvd_bound.h) counts what any path
// must pay across the blocks, so the search expands the few layouts inside a block that can
// still beat the sum across them instead of giving up after 4000.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "planner/rvd.h"
#include "planner/rvd_bound.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {

const Box kWhole = full_box({64, 256});  // a 64 x 256 f32 weight: 64 KiB

// Member b * lanes + p holds addend b * lanes + p of the gradient and needs the whole sum.
struct GradientSum {
  std::vector<Piece> from;
  std::vector<std::optional<Piece>> need;
};
GradientSum gradient_sum(int blocks, int lanes) {
  GradientSum s;
  for (int m = 0; m < blocks * lanes; ++m) {
    s.from.push_back(Piece{kWhole, m, blocks * lanes});
    s.need.push_back(Piece{kWhole});
  }
  return s;
}

TEST(RvdBlocks, AGradientOver128ReplicasOf4LanesIsSummedInsideEachReplicaThenAcrossThem) {
  CostModel cm;  // launch 10 us, 10 us a message step across nodes: the 512 members are 64 nodes
  GradientSum s = gradient_sum(128, 4);
  RvdPath p = rvd_search(s.from, s.need, kWhole, 4, cm, true, nullptr, 128);
  // Two pairwise sums inside each replica (2 launches + 4 steps) are cheaper than one over its
  // 4 lanes (1 launch + 6 steps); then one all-reduce over the 128 replicas, which a team can
  // only span whole. One all-reduce over all 512 would pay 1022 steps.
  EXPECT_EQ(test_util::collectives_of(p),
            (std::vector<std::string>{"all_reduce/2", "all_reduce/2", "all_reduce/128"}));
  const int64_t bytes = box_numel(kWhole) * 4;
  const double want = 2 * cm.collective(CollKind::kAllReduce, 2, bytes, true) +
                      cm.collective(CollKind::kAllReduce, 128, bytes, true);
  EXPECT_NEAR(p.cost, want, 1e-8);
  // The across-replica teams: one per lane position, the same lane of every replica.
  const Move& across = p.moves.back();
  ASSERT_EQ(across.teams.size(), 4u);
  for (int lane = 0; lane < 4; ++lane) {
    std::vector<int> team;
    for (int b = 0; b < 128; ++b) team.push_back(b * 4 + lane);
    EXPECT_EQ(across.teams[size_t(lane)], team);
  }
  // Before the bound counted the sum across the blocks, the search gave up after 4000
  // layouts; it now expands only those that can still beat it (36 here).
  EXPECT_LE(p.layouts, 40);
}

TEST(RvdBlocks, TheBoundNeverExceedsWhatTheFoundPathStillPays) {
  CostModel cm;
  for (auto [blocks, lanes] :
       {std::pair{128, 4}, std::pair{16, 4}, std::pair{8, 2}, std::pair{4, 8}}) {
    SCOPED_TRACE(std::to_string(blocks) + " blocks of " + std::to_string(lanes));
    GradientSum s = gradient_sum(blocks, lanes);
    RvdPath p = rvd_search(s.from, s.need, kWhole, 4, cm, true, nullptr, blocks);
    // At the start: the fixed part of an all-reduce over one member of every block where a
    // reduce-scatter across the blocks leaves a block less than the whole (lanes < blocks);
    // else of one collective over them (8 lanes over 4 blocks may hold the whole again).
    EXPECT_DOUBLE_EQ(rvd_lower_bound(s.from, s.need, kWhole, cm, true, blocks),
                     cm.collective(lanes < blocks ? CollKind::kAllReduce : CollKind::kReduceScatter,
                                   blocks, 0, true));
    double paid = 0;
    for (const Move& m : p.moves) {
      paid += m.cost;
      EXPECT_LE(rvd_lower_bound(m.after, s.need, kWhole, cm, true, blocks), p.cost - paid + 1e-8)
          << move_name(m.kind) << "/" << m.factor;
    }
    EXPECT_EQ(rvd_lower_bound(p.moves.back().after, s.need, kWhole, cm, true, blocks), 0);
  }
}

TEST(RvdBlocks, AShardNeedPaysOneCollectiveAcrossTheBlocksNotTwo) {
  CostModel cm;
  // ZeRO's need: member m of 256 (128 blocks of 2 lanes) reads column m of the summed
  // gradient. A reduce-scatter across the blocks can serve it, so the bound is one collective
  // over them, not an all-reduce.
  GradientSum s = gradient_sum(128, 2);
  for (int m = 0; m < 256; ++m) {
    Piece shard{kWhole};
    shard.box[1] = *shard.box[1].part(m, 256);
    s.need[size_t(m)] = shard;
  }
  EXPECT_DOUBLE_EQ(rvd_lower_bound(s.from, s.need, kWhole, cm, true, 128),
                   cm.collective(CollKind::kReduceScatter, 128, 0, true));
  RvdPath p = rvd_search(s.from, s.need, kWhole, 4, cm, true, nullptr, 128);
  EXPECT_GE(p.cost, cm.collective(CollKind::kReduceScatter, 128, 0, true));
  ASSERT_FALSE(p.moves.empty());
  EXPECT_EQ(p.moves.back().kind, MoveKind::kReduceScatter);
}

TEST(RvdBlocks, ElementsNoMoveInsideABlockHoldsNeedOneCollectiveAcrossTheBlocks) {
  CostModel cm;
  // 8 blocks of 2: block b holds rows chunk b of 8 (both lanes the same), everyone needs the
  // whole: only a gather across the blocks brings the other rows.
  std::vector<Piece> from;
  std::vector<std::optional<Piece>> need;
  for (int m = 0; m < 16; ++m) {
    Piece p{kWhole};
    p.box[0] = *p.box[0].part(m / 2, 8);
    from.push_back(p);
    need.push_back(Piece{kWhole});
  }
  EXPECT_DOUBLE_EQ(rvd_lower_bound(from, need, kWhole, cm, true, 8),
                   cm.collective(CollKind::kAllGather, 8, 0, true));
  RvdPath p = rvd_search(from, need, kWhole, 4, cm, true, nullptr, 8);
  EXPECT_EQ(test_util::collectives_of(p), (std::vector<std::string>{"all_gather/8"}));
}

// The MoE layout at world 512 (ep 4 x dp 128), which gave up in the search of a dense
// gradient: every dense gradient is summed inside each replica's 4 lanes, then across the 128
// replicas; every expert's gradient (one expert per lane) across the replicas only.
TEST(RvdBlocks, TheMoeLayoutAtWorld512PlansItsGradientsInsideEachReplicaThenAcross) {
  core::JobSpec spec = test_util::moe_spec(4, 2);
  spec.parallel.ep = 4;
  spec.parallel.dp = 128;
  spec.train.global_batch = 1024;  // micro_batch 2 x dp 128 x ep 4
  core::ModelGraph mg = build_planning_graph(spec);
  Plan plan = make_plan(spec, mg.graph, 512);
  ASSERT_EQ(plan.world(), 512);
  for (int lane = 0; lane < 4; ++lane) {
    SCOPED_TRACE("lane " + std::to_string(lane));
    std::map<size_t, int64_t> bytes_by_team_size;
    std::set<std::vector<int>> teams;
    for (const Instr* in : test_util::collectives(
             plan.role_of(lane), [](const Instr& c) { return c.part == "grad.sync"; })) {
      EXPECT_EQ(in->coll, CollKind::kAllReduce);
      const std::vector<int>& ranks = plan.groups.at(size_t(plan.group_id(in->group, 0))).ranks;
      bytes_by_team_size[ranks.size()] += in->bytes;
      teams.insert(ranks);
    }
    // The pairs inside replica 0, then this lane across every replica.
    std::vector<int> across;
    for (int b = 0; b < 128; ++b) across.push_back(b * 4 + lane);
    EXPECT_TRUE(teams.count(across));
    EXPECT_TRUE(teams.count({lane & ~1, (lane & ~1) + 1}));
    EXPECT_TRUE(teams.count({lane & 1, (lane & 1) + 2}));
    EXPECT_EQ(teams.size(), 3u);
    // The sums inside the replica move the dense gradients only; the sum across the replicas
    // moves those and this lane's expert.
    ASSERT_EQ(bytes_by_team_size.size(), 2u);
    EXPECT_GT(bytes_by_team_size[128], bytes_by_team_size[2] / 2);
  }
}

}  // namespace
}  // namespace weft::planner
