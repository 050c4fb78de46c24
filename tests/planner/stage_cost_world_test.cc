// The plan search's stage costs price each collective at the candidate's world, as the RVD
// search prices a move (planner/rvd.cc): launch_oversub where a node runs more ranks than
// cores, nothing more on GPUs (cores: 0).
#include <gtest/gtest.h>

#include "planner/hardware.h"
#include "planner/planner.h"
#include "planner/stage_cost.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {

// Each collective 1 ms more when the node is oversubscribed.
CostModel cpu_host() { return test_util::two_core_host(1e-3); }

Layout layout_of(const Degrees& deg, int64_t layers) {
  Layout l;
  l.deg = deg;
  l.micro_batch = 2;
  l.micro_batches = 1;
  l.chunk_layers = {layers};
  return l;
}

TEST(StageCostWorld, CrossingCarriesTheCandidatesWorld) {
  EXPECT_EQ(crossing(Degrees{4, 2, 1, 1}, test_util::kStageOrder, 8).world, 8);
  EXPECT_EQ(crossing(Degrees{2, 2, 3, 2}, test_util::kStageOrder, 8).world, 24);
}

// tp 2 x dp 4 = 8 ranks on 2 cores: each of a layer's tensor-parallel all-reduces (two
// forward: after attention's and the MLP's row-parallel matmuls; two backward: the
// gradients of their column-parallel inputs) pays launch_oversub once more; at world 0
// (unknown), as before, it does not.
TEST(StageCostWorld, ACandidateWithMoreRanksThanCoresPaysTheOversubscribedLaunch) {
  const core::JobSpec spec = test_util::gpt_spec(2, 64, 4, 256, 16);
  const core::ModelGraph mg = build_planning_graph(spec);
  const CostModel cm = cpu_host();
  const Degrees deg{4, 2, 1, 1};
  Crossing at8 = crossing(deg, test_util::kStageOrder, cm.ranks_per_node);
  ASSERT_EQ(at8.world, 8);
  Crossing unknown = at8;
  unknown.world = 0;
  const int64_t G = spec.train.global_batch;
  const SplitCosts a = split_costs(mg.graph, cm, G, 2, 1, 2, at8);
  const SplitCosts b = split_costs(mg.graph, cm, G, 2, 1, 2, unknown);
  ASSERT_EQ(a.fwd.size(), 2u);
  for (size_t layer = 0; layer < a.fwd.size(); ++layer) {
    EXPECT_NEAR(a.fwd[layer] - b.fwd[layer], 2 * cm.launch_oversub, 1e-12) << "layer " << layer;
    EXPECT_NEAR(a.bwd[layer] - b.bwd[layer], 2 * cm.launch_oversub, 1e-12) << "layer " << layer;
  }
  // The whole candidate: its gradients' all-reduce across the 4 replicas (one bucket) and
  // the step's norm all-reduces add theirs too.
  const Layout l = layout_of(deg, 2);
  const std::vector<int64_t> flight = stage_in_flight("1f1b", 1, 1, 1);
  const double with = predict(spec.model, a, l, cm, at8, flight).step_s;
  const double without = predict(spec.model, b, l, cm, unknown, flight).step_s;
  EXPECT_GT(with - without, 4 * 2 * cm.launch_oversub);
}

// A collective is priced as the RVD search prices a move: CostModel::collective at one rank
// per core plus launch_oversub where the world oversubscribes the node.
TEST(StageCostWorld, OneCollectiveIsPricedAsTheLayoutSearchPricesAMove) {
  const CostModel cm = cpu_host();
  const int64_t bytes = 1 << 20;
  EXPECT_DOUBLE_EQ(collective_at(cm, CollKind::kAllReduce, 4, bytes, false, 512),
                   cm.collective(CollKind::kAllReduce, 4, bytes, false) + cm.launch_oversub);
  // No more ranks on the node than cores: no extra.
  EXPECT_DOUBLE_EQ(collective_at(cm, CollKind::kAllReduce, 2, bytes, false, 2),
                   cm.collective(CollKind::kAllReduce, 2, bytes, false));
  EXPECT_EQ(collective_at(cm, CollKind::kAllReduce, 1, bytes, false, 512), 0);
}

// GPU presets have cores: 0, so no price depends on the world.
TEST(StageCostWorld, GpuPresetsPriceEveryWorldAlike) {
  const core::JobSpec spec = test_util::gpt_spec(2, 64, 4, 256, 16);
  const core::ModelGraph mg = build_planning_graph(spec);
  for (const std::string& preset : hardware_presets()) {
    SCOPED_TRACE(preset);
    const CostModel cm = load_hardware(preset).cost_model();
    ASSERT_EQ(cm.cores, 0);
    const Degrees deg{4, 2, 1, 1};
    const Crossing at8 = crossing(deg, test_util::kStageOrder, cm.ranks_per_node);
    Crossing unknown = at8;
    unknown.world = 0;
    const SplitCosts a = split_costs(mg.graph, cm, spec.train.global_batch, 2, 1, 2, at8);
    const SplitCosts b = split_costs(mg.graph, cm, spec.train.global_batch, 2, 1, 2, unknown);
    EXPECT_EQ(a.fwd, b.fwd);
    EXPECT_EQ(a.bwd, b.bwd);
    const Layout l = layout_of(deg, 2);
    const std::vector<int64_t> flight = stage_in_flight("1f1b", 1, 1, 1);
    EXPECT_EQ(predict(spec.model, a, l, cm, at8, flight).step_s,
              predict(spec.model, b, l, cm, unknown, flight).step_s);
  }
}

}  // namespace
}  // namespace weft::planner
