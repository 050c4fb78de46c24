// Pipeline traffic through phase 3: a value replicated over a stage's tp lanes crosses to
// the next stage as is on one node, and as 1/tp per lane re-gathered by the receiving
// stage's layout search when the stages are on different nodes and bandwidth dominates
// (Megatron's scatter-gather, chosen by the cost model, not written as a rule). The test
// model's activations are 8 KiB, where latency would decide: the model here has none.
#include <gtest/gtest.h>

#include <map>

#include "planner/validate.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {

struct Traffic {
  int64_t sent = 0, recv = 0;  // bytes of sends and receives, all ranks
  int64_t gathers = 0;         // all-gathers of activations (not ZeRO's)
};

Traffic traffic(const core::JobSpec& s, int world, int ranks_per_node) {
  core::ModelGraph mg = build_planning_graph(s);
  PlanOptions o;
  o.cost.ranks_per_node = ranks_per_node;
  o.cost.alpha_intra = o.cost.alpha_inter = o.cost.launch = 0;
  Plan p = make_plan(s, mg.graph, world, o);
  ValidationReport v = validate_plan(p, mg.graph);
  for (const std::string& e : v.errors) ADD_FAILURE() << e;
  Traffic t;
  for (int r = 0; r < p.world(); ++r)
    for (const Instr& in : p.role_of(r).program) {
      if (in.kind == InstrKind::kSend) t.sent += in.bytes;
      if (in.kind == InstrKind::kRecv) t.recv += in.bytes;
      if (in.kind == InstrKind::kCollective && in.coll == CollKind::kAllGather && in.part.empty()) ++t.gathers;
    }
  return t;
}

TEST(PipelineTransfer, StagesOnTwoNodesSendHalvesAndTheReceiverGathersThem) {
  core::JobSpec s = test_util::gpt_spec(4);
  s.parallel.tp = 2, s.parallel.pp = 2;
  const Traffic one_node = traffic(s, 4, 8), two_nodes = traffic(s, 4, 2);
  EXPECT_EQ(one_node.sent, one_node.recv);
  EXPECT_EQ(two_nodes.sent, two_nodes.recv);
  EXPECT_EQ(one_node.gathers, 0) << "on one node every lane sends what it holds";
  // Every transfer here is replicated over the tp pair (the residual stream and its
  // gradient), so each lane sends half.
  EXPECT_EQ(two_nodes.sent * 2, one_node.sent);
  EXPECT_GT(two_nodes.gathers, 0);
}

TEST(PipelineTransfer, WithoutTensorParallelismNothingIsSplit) {
  core::JobSpec s = test_util::gpt_spec(4);
  s.parallel.pp = 2;
  const Traffic one = traffic(s, 2, 8), apart = traffic(s, 2, 1);
  EXPECT_EQ(one.sent, apart.sent);
  EXPECT_EQ(apart.gathers, 0);
}

}  // namespace
}  // namespace weft::planner
