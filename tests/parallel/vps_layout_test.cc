// The VPS layout function on real plans: every state element held somewhere, every box
// read off a persistent plan tensor (the table the executor allocates from), ZeRO shards
// disjoint, replicas counted; and flat ZeRO ranges decomposed into few plain boxes.
#include <gtest/gtest.h>

#include <random>

#include "parallel/tensor_table.h"
#include "tests/parallel/vps_util.h"

namespace weft::parallel {
namespace {

using test_util::Degrees;
using test_util::plan_for;
using test_util::space_for;
using test_util::tiny_spec;

struct PlanCase {
  std::string name;
  bool moe;
  Degrees deg;
};

std::vector<PlanCase> plan_cases() {
  return {{"single", false, {}},
          {"dp2_tp2", false, {2, 2, 1, 1, 0}},
          {"pp2", false, {1, 1, 2, 1, 0}},
          {"dp2_pp2", false, {2, 1, 2, 1, 0}},
          {"dp4_zero1", false, {4, 1, 1, 1, 1}},
          {"dp2_tp2_zero3", false, {2, 2, 1, 1, 3}},
          {"tp4", false, {1, 4, 1, 1, 0}},
          {"moe_ep2", true, {1, 1, 1, 2, 0}},
          {"moe_ep4", true, {1, 1, 1, 4, 0}},
          {"moe_dp2_ep2_zero1", true, {2, 1, 1, 2, 1}}};
}

class VpsPlans : public ::testing::TestWithParam<PlanCase> {};

TEST_P(VpsPlans, LayoutIsReadOffThePlansPersistentTensorsAndCoversTheState) {
  const PlanCase& c = GetParam();
  core::JobSpec spec = tiny_spec(c.moe);
  planner::Plan plan = plan_for(spec, c.deg);
  StateSpace space = space_for(spec);
  Layout l = layout_of(space, plan);
  ASSERT_EQ(l.world(), plan.world());
  check_covers(space, l);

  for (int r = 0; r < plan.world(); ++r) {
    planner::RankProgram prog = plan.program(r);
    const RankLayout& rl = l.ranks[size_t(r)];
    // Every persistent root tensor of a state value is one local tensor, same shape, same id.
    int expected = 0;
    for (size_t i = 0; i < prog.tensors.size(); ++i) {
      const planner::TensorDesc& t = prog.tensors[i];
      if (!t.persistent || t.alias_of >= 0 || space.of_value(t.value) < 0) continue;
      ++expected;
      bool found = false;
      for (const LocalTensor& lt : rl.locals)
        if (lt.plan_tensor == int(i)) {
          found = true;
          EXPECT_EQ(lt.shape, planner::box_shape(t.piece.box)) << space.at(lt.state).name;
          EXPECT_EQ(lt.state, space.of_value(t.value));
        }
      EXPECT_TRUE(found) << "plan tensor " << i << " (" << t.name << ") of rank " << r
                         << " has no local tensor";
    }
    int from_plan = 0;
    for (const LocalTensor& lt : rl.locals) from_plan += lt.plan_tensor >= 0;
    EXPECT_EQ(from_plan, expected);
    // Each local tensor's boxes tile it exactly.
    for (size_t li = 0; li < rl.locals.size(); ++li) {
      int64_t n = 0;
      for (const StateBox& b : rl.boxes)
        if (b.local == int(li)) n += b.numel();
      EXPECT_EQ(n, core::shape_numel(rl.locals[li].shape));
    }
  }
  // Replica-0 boxes are a disjoint cover: their sizes add up to each state exactly.
  std::vector<int64_t> held(size_t(space.size()), 0);
  for (const RankLayout& rl : l.ranks)
    for (const StateBox& b : rl.boxes)
      if (b.replica == 0) held[size_t(b.state)] += b.numel();
  for (const StateTensor& t : space.tensors())
    EXPECT_EQ(held[size_t(t.id)], core::shape_numel(t.shape)) << t.name;
}

TEST_P(VpsPlans, TheExecutorsTensorTableAllocatesExactlyTheseLocalTensors) {
  // One layout function: the multi-rank executor's persistent state is what layout_of names.
  const PlanCase& c = GetParam();
  core::JobSpec spec = tiny_spec(c.moe);
  planner::Plan plan = plan_for(spec, c.deg);
  core::ModelGraph mg = planner::build_planning_graph(spec);
  StateSpace space = StateSpace::from_graph(mg.graph);
  for (int r = 0; r < plan.world(); ++r) {
    planner::RankProgram prog = plan.program(r);
    TensorTable table(prog, mg.graph);
    for (const LocalTensor& lt : layout_of(space, plan, r).locals) {
      if (lt.plan_tensor < 0) continue;
      ASSERT_TRUE(table.live(lt.plan_tensor)) << space.at(lt.state).name;
      const core::Tensor& x = table.read(lt.plan_tensor);
      EXPECT_EQ(x.shape(), lt.shape) << space.at(lt.state).name;
      EXPECT_EQ(x.dtype(), lt.dtype) << space.at(lt.state).name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, VpsPlans, ::testing::ValuesIn(plan_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(Vps, SingleProcessPlanLayoutIsTheWholeLayout) {
  core::JobSpec spec = tiny_spec();
  StateSpace space = space_for(spec);
  Layout from_plan = layout_of(space, plan_for(spec, {}));
  Layout whole = whole_layout(space);
  ASSERT_EQ(from_plan.ranks[0].boxes.size(), whole.ranks[0].boxes.size());
  for (size_t i = 0; i < whole.ranks[0].boxes.size(); ++i) {
    const StateBox &p = from_plan.ranks[0].boxes[i], &w = whole.ranks[0].boxes[i];
    EXPECT_EQ(p.state, w.state);
    EXPECT_EQ(p.start, w.start);
    EXPECT_EQ(p.extent, w.extent);
  }
}

TEST(Vps, StateSpaceHoldsParametersMomentsAndScalarsButNoGradients) {
  core::JobSpec spec = tiny_spec();
  StateSpace space = space_for(spec);
  int params = 0, m = 0, v = 0, scalars = 0;
  for (const StateTensor& t : space.tensors()) {
    params += t.kind == StateKind::kParameter;
    m += t.kind == StateKind::kAdamM;
    v += t.kind == StateKind::kAdamV;
    scalars += t.kind == StateKind::kScalar;
    EXPECT_EQ(t.name.rfind("grad:", 0), std::string::npos) << t.name;
  }
  EXPECT_GT(params, 0);
  EXPECT_EQ(m, params);
  EXPECT_EQ(v, params);
  EXPECT_EQ(scalars, 3);
  EXPECT_GE(space.find("adam_m:wte.weight"), 0);
  EXPECT_GE(space.find(kStepState), 0);
}

TEST(Vps, TensorParallelQkvIsStridedAndDecomposesIntoThreeBoxesPerRank) {
  core::JobSpec spec = tiny_spec();
  StateSpace space = space_for(spec);
  Layout l = layout_of(space, plan_for(spec, {1, 2, 1, 1, 0}));
  StateId qkv = space.find("h.0.attn.qkv.weight");
  ASSERT_GE(qkv, 0);
  for (const RankLayout& rl : l.ranks) {
    int boxes = 0;
    for (const StateBox& b : rl.boxes) boxes += b.state == qkv;
    EXPECT_EQ(boxes, 3) << "q, k and v rows of this rank's heads";
  }
}

TEST(Vps, FlatRangesBecomeFewPlainBoxesInFlatOrder) {
  std::mt19937_64 rng(7);
  for (int iter = 0; iter < 2000; ++iter) {
    core::Shape shape;
    int dims = 1 + int(rng() % 4);
    for (int d = 0; d < dims; ++d) shape.push_back(1 + int64_t(rng() % 6));
    int64_t n = core::shape_numel(shape);
    int64_t b = int64_t(rng() % uint64_t(n + 1)), e = int64_t(rng() % uint64_t(n + 1));
    if (b > e) std::swap(b, e);
    auto boxes = flat_range_boxes(shape, b, e);
    EXPECT_LE(boxes.size(), size_t(2 * dims - 1));
    // In flat order, contiguous, exactly [b, e).
    int64_t next = b;
    for (auto& [start, extent] : boxes) {
      std::vector<int64_t> flat;
      test_util::for_each_element(shape, start, extent, [&](int64_t f) { flat.push_back(f); });
      for (int64_t f : flat)
        ASSERT_EQ(f, next++) << core::shape_str(shape) << " [" << b << ", " << e << ")";
    }
    EXPECT_EQ(next, e);
  }
}

TEST(Vps, CheckCoversFindsAGap) {
  core::JobSpec spec = tiny_spec();
  StateSpace space = space_for(spec);
  Layout l = whole_layout(space);
  l.ranks[0].boxes[0].extent[0] -= 1;
  EXPECT_THROW(check_covers(space, l), InternalError);
}

}  // namespace
}  // namespace weft::parallel
