// Pipeline traffic through phase 3: a value replicated over a stage's tp lanes crosses to
// the next stage as is on one node, and as 1/tp per lane re-gathered by the receiving
// stage's layout search when the stages are on different nodes and bandwidth dominates
// (Megatron's scatter-gather, chosen by the cost model, not written as a rule). The test
// model's activations are 8 KiB, where latency would decide: the model here has none.
#include <gtest/gtest.h>

#include <map>

#include "planner/simulate.h"
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

namespace weft::planner {
namespace {

// A pipeline send holds its CPU-host rank for the message's transfer (CostModel::send_s):
// every send of a pp 2 plan on a 2-core host lasts exactly p2p of its bytes in the
// timeline; on a GPU model a send takes no time of its rank. Re-timing (the simulator's
// fixed point over the cores) prices a send as the engine does: a pp 2 x dp 2 plan on the
// same host, every send's span the transfer at that world.
TEST(PipelineTransfer, ASendHoldsItsCpuRankForTheTransfer) {
  CostModel cpu;
  cpu.cores = 2;
  cpu.ranks_per_node = 64;
  cpu.alpha_intra = 1e-4, cpu.bw_intra = 1e9;
  for (const int dp : {1, 2}) {
    core::JobSpec s = test_util::gpt_spec(2, 64, 4, 256, 16);
    s.parallel.pp = 2, s.parallel.dp = dp;
    const core::ModelGraph mg = build_planning_graph(s);
    PlanOptions po;
    po.simulate = false;
    po.cost = cpu;
    const int world = 2 * dp;
    const Plan p = make_plan(s, mg.graph, world, po);
    for (const bool gpu : {false, true}) {
      SCOPED_TRACE("dp " + std::to_string(dp) + (gpu ? " gpu" : " cpu"));
      CostModel cm = cpu;
      if (gpu) cm.cores = 0;
      std::vector<std::vector<Span>> tl;
      const CostAnnotations c = simulate_plan(p, mg.graph, cm, &tl);
      ASSERT_TRUE(c.valid);
      int64_t bytes = 0;
      int planned = 0;
      for (const Instr& in : p.roles.at(0).program)
        if (in.kind == InstrKind::kSend) bytes = in.bytes, ++planned;
      ASSERT_GT(planned, 0);
      // At world 2 no core is shared: exactly the transfer. At 4 ranks on 2 cores its bytes
      // move at the shared rate, between one and two ranks a core (the fixed point's count).
      const double alone = cm.send_s(bytes, false, 2), shared = cm.send_s(bytes, false, world);
      int sends = 0;
      for (size_t r = 0; r < tl.size(); ++r)
        for (const Span& sp : tl[r])
          if (sp.kind == InstrKind::kSend) {
            ++sends;
            if (dp == 1) EXPECT_DOUBLE_EQ(sp.end - sp.start, alone) << "rank " << r;
            EXPECT_GE(sp.end - sp.start, alone * (1 - 1e-12)) << "rank " << r;
            EXPECT_LE(sp.end - sp.start, shared * (1 + 1e-12)) << "rank " << r;
          }
      if (gpu) {
        EXPECT_EQ(sends, 0);
        EXPECT_EQ(cm.send_s(bytes, false, world), 0);
      } else {
        EXPECT_GE(sends, 2 * planned);  // both stages send
        EXPECT_DOUBLE_EQ(alone, 1e-4 + double(bytes) / 1e9);
      }
    }
  }
}

}  // namespace
}  // namespace weft::planner
