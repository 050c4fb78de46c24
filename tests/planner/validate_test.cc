// The validator: valid plans pass; hand-made and mutated plans with a mis-ordered
// collective, a missing send, a read before production or too much memory are caught.
#include <gtest/gtest.h>

#include "planner/validate.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {

bool mentions(const ValidationReport& r, const std::string& what) {
  for (const std::string& e : r.errors)
    if (e.find(what) != std::string::npos) return true;
  return false;
}

// Two ranks (tp 2), one role each, with persistent tensors 0..3 and the given programs.
Plan two_rank_plan(std::vector<Instr> p0, std::vector<Instr> p1) {
  Plan plan;
  plan.config.deg = Degrees{1, 2, 1, 1};
  plan.mesh = Mesh(plan.config.deg, {Axis::kTp, Axis::kEp, Axis::kDp, Axis::kPp});
  GroupFamily f;
  f.members = {{0, 0}, {0, 1}};
  add_family(plan, f);
  build_groups(plan);
  for (int lane = 0; lane < 2; ++lane) {
    Role r;
    r.lane = lane;
    for (int t = 0; t < 4; ++t) {
      TensorDesc d;
      d.name = "t" + std::to_string(t);
      d.piece.box = full_box({4});
      d.bytes = 16;
      d.persistent = t < 2;  // t0, t1 hold state; t2, t3 are produced by instructions
      r.tensors.push_back(d);
    }
    r.program = lane == 0 ? p0 : p1;
    plan.roles.push_back(r);
  }
  return plan;
}

Instr coll(CollKind k, int in, int out, int64_t bytes) {
  Instr c;
  c.kind = InstrKind::kCollective;
  c.coll = k;
  c.group = 0;
  c.in = {{-1, in}};
  c.out = {{-1, out}};
  c.bytes = bytes;
  return c;
}

TEST(Validator, MatchedProgramsPass) {
  core::ModelGraph mg = build_planning_graph(test_util::gpt_spec());
  Plan p = two_rank_plan({coll(CollKind::kAllReduce, 0, 2, 16), coll(CollKind::kAllGather, 1, 3, 16)},
                         {coll(CollKind::kAllReduce, 0, 2, 16), coll(CollKind::kAllGather, 1, 3, 16)});
  ValidationReport r = validate_plan(p, mg.graph);
  EXPECT_TRUE(r.ok);
  for (const std::string& e : r.errors) ADD_FAILURE() << e;
}

TEST(Validator, CatchesMisOrderedCollectives) {
  core::ModelGraph mg = build_planning_graph(test_util::gpt_spec());
  Plan p = two_rank_plan({coll(CollKind::kAllReduce, 0, 2, 16), coll(CollKind::kAllGather, 1, 3, 16)},
                         {coll(CollKind::kAllGather, 1, 3, 16), coll(CollKind::kAllReduce, 0, 2, 16)});
  ValidationReport r = validate_plan(p, mg.graph);
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(mentions(r, "different orders")) << (r.errors.empty() ? "" : r.errors[0]);
}

TEST(Validator, CatchesAMissingSendAndAReadBeforeProduction) {
  core::ModelGraph mg = build_planning_graph(test_util::gpt_spec());
  Instr recv;
  recv.kind = InstrKind::kRecv;
  recv.peer = 0;  // a stage in role programs; here the only stage, i.e. the same rank's peer
  recv.tag = 7;
  recv.bytes = 16;
  recv.out = {{-1, 2}};
  Instr use;
  use.kind = InstrKind::kLocal;
  use.in = {{-1, 3}};  // never produced
  use.out = {{-1, 2}};
  Plan p = two_rank_plan({recv}, {use});
  ValidationReport r = validate_plan(p, mg.graph);
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(mentions(r, "waits for a message"));
  EXPECT_TRUE(mentions(r, "before it is produced"));
}

TEST(Validator, RealPlansPassAndMutationsFail) {
  core::JobSpec s = test_util::gpt_spec(2);
  s.parallel.pp = 2;
  s.parallel.tp = 2;
  core::ModelGraph mg = build_planning_graph(s);
  Plan p = make_plan(s, mg.graph, 4);
  ASSERT_TRUE(validate_plan(p, mg.graph).ok);

  // A stage that forgets one send: its peer waits forever.
  Plan missing = p;
  auto& prog = missing.roles[0].program;
  auto it = std::find_if(prog.begin(), prog.end(), [](const Instr& i) { return i.kind == InstrKind::kSend; });
  ASSERT_NE(it, prog.end());
  prog.erase(it);
  ValidationReport r = validate_plan(missing, mg.graph);
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(mentions(r, "deadlock"));

  // One lane issues its first two tensor-parallel collectives in the other order.
  Plan swapped = p;
  auto& lane1 = swapped.roles[1].program;
  std::vector<size_t> colls;
  for (size_t i = 0; i < lane1.size() && colls.size() < 2; ++i)
    if (lane1[i].kind == InstrKind::kCollective) colls.push_back(i);
  ASSERT_EQ(colls.size(), 2u);
  std::swap(lane1[colls[0]], lane1[colls[1]]);
  EXPECT_FALSE(validate_plan(swapped, mg.graph).ok);

  // A memory budget below what the plan holds.
  ValidationReport tight = validate_plan(p, mg.graph, 4096);
  EXPECT_FALSE(tight.ok);
  EXPECT_TRUE(mentions(tight, "over its memory budget"));
  EXPECT_THROW(require_valid(p, mg.graph, 4096), InternalError);
  int64_t peak = *std::max_element(tight.peak_bytes.begin(), tight.peak_bytes.end());
  EXPECT_TRUE(validate_plan(p, mg.graph, peak).ok);
}

TEST(Validator, EveryLayoutValidates) {
  struct Case {
    int world;
    int64_t tp, pp, ep;
    int zero;
    std::string sched, recompute;
    int64_t v;
  };
  for (const Case& c : std::vector<Case>{{1, 1, 1, 1, 0, "1f1b", "none", 1},
                                         {2, 2, 1, 1, 0, "1f1b", "none", 1},
                                         {2, 1, 2, 1, 0, "1f1b", "none", 1},
                                         {4, 2, 2, 1, 0, "gpipe", "none", 1},
                                         {8, 2, 2, 1, 2, "1f1b", "full", 1},
                                         {4, 1, 2, 1, 1, "interleaved", "selective", 2},
                                         {8, 1, 2, 2, 3, "1f1b", "full", 1},
                                         {8, 2, 1, 2, 1, "1f1b", "none", 1},
                                         {16, 2, 2, 2, 2, "1f1b", "selective", 1}}) {
    core::JobSpec s = c.ep > 1 ? test_util::moe_spec(4, 2) : test_util::gpt_spec(4);
    s.model.layers = 4;
    s.train.global_batch = 16;
    s.parallel.tp = c.tp, s.parallel.pp = c.pp, s.parallel.ep = c.ep, s.parallel.zero = c.zero;
    s.parallel.pipeline.schedule = c.sched;
    s.parallel.pipeline.virtual_stages = c.v;
    s.parallel.recompute = c.recompute;
    SCOPED_TRACE(std::to_string(c.world) + " tp" + std::to_string(c.tp) + " pp" + std::to_string(c.pp) + " ep" +
                 std::to_string(c.ep) + " zero" + std::to_string(c.zero) + " " + c.sched + " " + c.recompute);
    core::ModelGraph mg = build_planning_graph(s);
    Plan p = make_plan(s, mg.graph, c.world);
    ValidationReport r = validate_plan(p, mg.graph);
    for (const std::string& e : r.errors) ADD_FAILURE() << e;
    EXPECT_TRUE(p.costs.valid);
    if (c.recompute != "none") {
      int re = 0;
      for (const Instr& in : p.roles[0].program) re += in.recompute && in.kind == InstrKind::kCompute;
      EXPECT_GT(re, 0);
    }
  }
}

}  // namespace
}  // namespace weft::planner
