// Gradient buckets for every move of a path, not only its last (lower_preserve.cc's
// `waits`, lower_step.cc's bucket depths), and the plan search's stage costs priced at the
// candidate's world (stage_cost.h's collective_at).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "planner/hardware.h"
#include "planner/planner.h"
#include "planner/stage_cost.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {

std::vector<int> tensors_of(const OperandList& ops) {
  std::vector<int> out;
  for (const Operand& o : ops) out.push_back(o.tensor);
  return out;
}

// The MoE layout at world 512 (ep 4 x dp 128) under CostModel's defaults: every dense
// gradient is summed by two pairwise all-reduces inside a replica, then across the 128
// replicas (RvdBlocks.TheMoeLayoutAtWorld512...). Each of the three moves waits in a bucket,
// so a rank makes three gradient calls, not two per dense gradient and one more, and each
// bucket reads what the one before it wrote.
TEST(GradBucket, TheMoeLayoutAtWorld512SumsItsGradientsInThreeCallsARank) {
  core::JobSpec spec = test_util::moe_spec(4, 2);
  spec.parallel.ep = 4;
  spec.parallel.dp = 128;
  spec.train.global_batch = 1024;  // micro_batch 2 x dp 128 x ep 4
  core::ModelGraph mg = build_planning_graph(spec);
  PlanOptions po;
  po.simulate = false;
  Plan plan = make_plan(spec, mg.graph, 512, po);
  for (int lane = 0; lane < 4; ++lane) {
    SCOPED_TRACE("lane " + std::to_string(lane));
    const Role& r = plan.role_of(lane);
    std::vector<const Instr*> calls = test_util::collectives(
        r, [](const Instr& c) { return c.part == "grad.sync"; });
    ASSERT_EQ(calls.size(), 3u);
    auto ranks = [&](const Instr* c) { return plan.groups.at(size_t(plan.group_id(c->group, 0))).ranks; };
    // In program order: the pair (lane, lane ^ 1), the pair (lane, lane ^ 2), then this lane
    // of every replica.
    EXPECT_EQ(ranks(calls[0]), (std::vector<int>{lane & ~1, (lane & ~1) + 1}));
    EXPECT_EQ(ranks(calls[1]), (std::vector<int>{lane & 1, (lane & 1) + 2}));
    std::vector<int> across;
    for (int b = 0; b < 128; ++b) across.push_back(b * 4 + lane);
    EXPECT_EQ(ranks(calls[2]), across);
    EXPECT_LT(calls[0], calls[1]);
    EXPECT_LT(calls[1], calls[2]);
    for (const Instr* c : calls) EXPECT_EQ(c->coll, CollKind::kAllReduce);
    // The dense gradients: every parameter not split over the experts (one whole piece on
    // each lane). The two sums inside the replica carry each of them once; the second reads
    // what the first wrote, and the sum across the replicas reads what the second wrote,
    // plus this lane's expert gradients.
    int dense = 0, experts = 0;
    std::set<int> seen;
    for (const TensorDesc& t : r.tensors) {
      if (t.value < 0 || mg.graph.value(t.value).role != core::Role::kParameter || !seen.insert(t.value).second)
        continue;
      (t.piece.numel() == int64_t(shape_elements(mg.graph.value(t.value).shape)) ? dense : experts)++;
    }
    ASSERT_GT(dense, 0);
    ASSERT_GT(experts, 0);
    EXPECT_EQ(int(calls[0]->in.size()), dense);
    EXPECT_EQ(int(calls[1]->in.size()), dense);
    EXPECT_EQ(int(calls[2]->in.size()), dense + experts);
    EXPECT_EQ(tensors_of(calls[1]->in), tensors_of(calls[0]->out));
    const std::vector<int> last = tensors_of(calls[2]->in);
    for (int t : tensors_of(calls[1]->out))
      EXPECT_TRUE(std::count(last.begin(), last.end(), t)) << "tensor " << t;
  }
}

}  // namespace
}  // namespace weft::planner
