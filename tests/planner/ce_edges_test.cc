// Vocabulary-parallel cross-entropy as edges: each lane's row max is a V-max value and its
// sums (sum of exponentials, target logit) a V-sum value over the tp lanes; phase 3's pass
// derives the max and the sum all-reduces (no hand-written collective). Checked on the
// instructions and tensors of plans whose vocabulary tp does not divide.
#include <gtest/gtest.h>

#include <string>

#include "planner/plan_json.h"
#include "planner/validate.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {

struct Case {
  std::string name;
  core::JobSpec spec;
  int world;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  core::JobSpec s = test_util::gpt_spec(2, 64, 4, 257);
  s.parallel.tp = 2;
  out.push_back({"tp2 vocab 257", s, 2});
  s.parallel.zero = 1;
  out.push_back({"tp2 dp2 zero1 vocab 257", s, 4});
  s = test_util::gpt_spec(2, 96, 6, 256);
  s.parallel.tp = 3;
  out.push_back({"tp3 vocab 256", s, 3});
  s = test_util::moe_spec(4, 2);
  s.model.vocab = 257;
  s.parallel.tp = 2, s.parallel.ep = 2;
  out.push_back({"ep2 tp2 vocab 257", s, 4});
  return out;
}

TEST(CeEdges, TheMaxAndTheSumsAreJoinedByTheCollectivesThePassDerives) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    core::ModelGraph pg = build_planning_graph(c.spec);
    Plan plan = make_plan(c.spec, pg.graph, c.world);
    ASSERT_TRUE(validate_plan(plan, pg.graph).ok);
    const Mesh& mesh = plan.mesh;
    const int tp = int(mesh.degrees().tp);
    const int64_t m = plan.config.micro_batches;
    for (const Role& r : plan.roles) {
      int maxes = 0, sums = 0;
      for (const Instr& in : r.program) {
        if (in.kind != InstrKind::kCollective || (in.part != "ce.max" && in.part != "ce.sums")) continue;
        const bool is_max = in.part == "ce.max";
        (is_max ? maxes : sums)++;
        EXPECT_EQ(in.coll, CollKind::kAllReduce);
        EXPECT_EQ(in.reduce, is_max ? ReduceOp::kMax : ReduceOp::kSum) << in.part;
        // The team: the tp lanes of this lane's ep group on this stage, in lane order, one
        // group per data-parallel replica.
        const GroupFamily& f = plan.families.at(size_t(in.group));
        EXPECT_FALSE(f.all_dp);
        ASSERT_EQ(int(f.members.size()), tp);
        for (int i = 0; i < tp; ++i)
          EXPECT_EQ(f.members[size_t(i)], std::make_pair(r.stage, i + tp * mesh.lane_ep(r.lane)));
        // In: this lane's addend (its tp index) of the operator; out: the whole rows, in place.
        ASSERT_EQ(in.in.size(), 1u);
        const TensorDesc& a = r.tensors.at(size_t(in.in[0].tensor));
        const TensorDesc& b = r.tensors.at(size_t(in.out[0].tensor));
        EXPECT_EQ(a.name, in.part);
        EXPECT_EQ(a.piece.part, mesh.lane_tp(r.lane));
        EXPECT_EQ(a.piece.parts, tp);
        EXPECT_EQ(a.piece.reduce, in.reduce);
        EXPECT_EQ(b.name, in.part);
        EXPECT_EQ(b.piece.parts, 1);
        EXPECT_EQ(b.piece.reduce, ReduceOp::kSum);
        EXPECT_EQ(b.piece.box, a.piece.box);
        EXPECT_EQ(b.alias_of, in.in[0].tensor) << "the pass reduces in place";
        EXPECT_EQ(a.piece.box.size(), is_max ? 2u : 3u);  // (b,t) and (2,b,t)
        EXPECT_EQ(in.bytes, a.bytes);
      }
      // One of each per micro-batch on the stage holding the loss, none elsewhere.
      const bool last = r.stage == int(mesh.degrees().pp) - 1;
      EXPECT_EQ(maxes, last ? m : 0) << "stage " << r.stage << " lane " << r.lane;
      EXPECT_EQ(sums, last ? m : 0) << "stage " << r.stage << " lane " << r.lane;
    }
    // The plan as printed (weft plan --json) names the operator of the max's addends and of
    // its all-reduce, and reads back the same.
    const std::string json = plan_to_json(plan);
    EXPECT_NE(json.find("\"reduce\""), std::string::npos);
    Plan back = plan_from_json(json);
    ASSERT_EQ(back.roles.size(), plan.roles.size());
    for (size_t i = 0; i < plan.roles.size(); ++i) EXPECT_EQ(back.roles[i], plan.roles[i]);
  }
}

// Every rank's resolved program (Plan::program): the max all-reduce runs over the ranks of
// its own tp team, under max, on its replica's rows.
TEST(CeEdges, RankProgramsReduceTheMaxOverTheirTpTeam) {
  core::JobSpec s = test_util::gpt_spec(2, 64, 4, 257);
  s.parallel.tp = 2, s.parallel.dp = 2;
  core::ModelGraph pg = build_planning_graph(s);
  Plan plan = make_plan(s, pg.graph, 4);
  for (int rank = 0; rank < plan.world(); ++rank) {
    RankProgram p = plan.program(rank);
    int found = 0;
    for (const Instr& in : p.program) {
      if (in.kind != InstrKind::kCollective || in.part != "ce.max") continue;
      ++found;
      EXPECT_EQ(in.reduce, ReduceOp::kMax);
      const std::vector<int>& ranks = plan.groups.at(size_t(in.group)).ranks;
      ASSERT_EQ(ranks.size(), 2u);
      for (int q : ranks) {
        EXPECT_EQ(plan.mesh.coord(q).dp, p.coord.dp) << "rank " << rank;
        EXPECT_EQ(plan.mesh.coord(q).pp, p.coord.pp);
      }
      // The rows are this replica's: replica d holds rows shifted by its batch share.
      const TensorDesc& a = p.tensors.at(size_t(in.in[0].tensor));
      EXPECT_EQ(a.piece.reduce, ReduceOp::kMax);
      EXPECT_EQ(a.piece.box[0].start, p.coord.dp * a.piece.box[0].size * plan.config.micro_batches +
                                          a.piece.box[0].size * in.mb);
    }
    EXPECT_EQ(found, plan.config.micro_batches) << "rank " << rank;
  }
}

}  // namespace
}  // namespace weft::planner
