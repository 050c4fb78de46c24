// Layout invariance in CI: a bounded set of layouts (dp, pp 1f1b, tp, ZeRO-1, ep) on a few
// steps; the full matrix on 30 steps is layout_long_test.cc (label `long`).
#include <gtest/gtest.h>

#include "tests/parallel/layout_harness.h"

namespace weft::test {
namespace {

void check(LayoutCase c) { expect_invariant(c, run_layout(c)); }

TEST(LayoutInvariance, Dp2) { check({"gpt-layout.yaml", 2, {"parallel.dp=2"}, 6, kRegroup}); }
TEST(LayoutInvariance, Pp2OneFOneB) {
  check({"gpt-layout.yaml",
         2,
         {"parallel.dp=1", "parallel.pp=2", "parallel.pipeline.schedule=1f1b"},
         6,
         kRegroup});
}
TEST(LayoutInvariance, Dp2Zero1) {
  check({"gpt-layout.yaml", 2, {"parallel.dp=2", "parallel.zero=1"}, 6, kRegroup});
}
TEST(LayoutInvariance, Tp2) {
  check({"gpt-layout.yaml", 2, {"parallel.dp=1", "parallel.tp=2"}, 6, kSplit});
}
TEST(LayoutInvariance, MoeEp2) {
  check({"moe-layout.yaml", 2, {"parallel.dp=1", "parallel.ep=2"}, 6, kRegroup});
}
// Planned as for nodes of two ranks and tensors large enough that latency does not count:
// each tp pair shares a node, the pipeline's stages are on two nodes, and phase 3 sends
// each activation as halves re-gathered on the receiving stage
// (tests/planner/pipeline_transfer_test.cc checks the plan). The numbers stay tp's.
TEST(LayoutInvariance, Tp2Pp2StagesOnTwoNodesSendHalvesAndGatherThem) {
  LayoutCase c{"gpt-layout.yaml", 4, {"parallel.dp=1", "parallel.tp=2", "parallel.pp=2"}, 6, kSplit};
  planner::CostModel cost;
  cost.ranks_per_node = 2;
  cost.alpha_intra = cost.alpha_inter = cost.launch = 0;
  c.cost = cost;
  check(c);
}

}  // namespace
}  // namespace weft::test
