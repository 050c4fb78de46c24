// The measured collective rates of a calibrated CPU host (CostModel::coll_bw_by_size): each
// kind priced at its own wire rate by call size, the presets and defaults as before, the
// hardware file and the plan file keeping the curves, bad curves refused naming the key.
#include <gtest/gtest.h>

#include "planner/hardware.h"
#include "planner/plan_json.h"
#include "planner/planner.h"
#include "planner/stage_cost.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {
using test_util::config_error;

constexpr double kKiB = 1024, kMiB = 1024 * 1024;

// A CPU host whose reduce-scatter moves bytes at a tenth of the link's rate and whose
// all-reduce slows from 4 GB/s at 64 KiB to 1 GB/s at 4 MiB (what Gloo does on 2 cores).
CostModel measured() {
  CostModel m;
  m.launch = 80e-6, m.alpha_intra = 70e-6, m.bw_intra = 3e9;
  m.coll_bw_by_size[size_t(CollKind::kAllReduce)] = {{64 * kKiB, 4e9}, {4 * kMiB, 1e9}};
  m.coll_bw_by_size[size_t(CollKind::kReduceScatter)] = {{64 * kKiB, 3e8}};
  return m;
}

TEST(CollectiveRates, WithoutCurvesEveryKindUsesTheLink) {
  const CostModel m;
  for (int k = 0; k < kCollKinds; ++k) EXPECT_EQ(m.coll_bw(CollKind(k), 1 << 20), m.bw_intra);
  EXPECT_DOUBLE_EQ(m.collective(CollKind::kAllReduce, 2, 1 << 20, false),
                   m.launch + 2 * m.alpha_intra + double(1 << 20) / m.bw_intra);
}

TEST(CollectiveRates, EachKindIsPricedAtItsOwnRateBySize) {
  const CostModel m = measured();
  // The byte term of each kind at its curve's rate, the fixed part as before.
  const int64_t b = int64_t(4 * kMiB);
  EXPECT_DOUBLE_EQ(m.collective(CollKind::kAllReduce, 2, b, false), 80e-6 + 2 * 70e-6 + double(b) / 1e9);
  EXPECT_DOUBLE_EQ(m.collective(CollKind::kReduceScatter, 2, b, false), 80e-6 + 70e-6 + double(b / 2) / 3e8);
  // A kind without a curve keeps the link's rate.
  EXPECT_DOUBLE_EQ(m.collective(CollKind::kAllGather, 2, b, false), 80e-6 + 70e-6 + double(b / 2) / 3e9);
  // Linear in log(bytes) between the points (512 KiB is halfway from 64 KiB to 4 MiB),
  // clamped at the ends.
  EXPECT_DOUBLE_EQ(m.coll_bw(CollKind::kAllReduce, int64_t(512 * kKiB)), 2.5e9);
  EXPECT_DOUBLE_EQ(m.coll_bw(CollKind::kAllReduce, 4), 4e9);
  EXPECT_DOUBLE_EQ(m.coll_bw(CollKind::kAllReduce, int64_t(64 * kMiB)), 1e9);
  // Across nodes nothing was measured: the inter-node link.
  EXPECT_DOUBLE_EQ(m.collective(CollKind::kReduceScatter, 2, b, true),
                   m.launch + m.alpha_inter + double(b / 2) / m.bw_inter);
}

TEST(CollectiveRates, TheStageModelPricesZeroOnesReduceScatterAtItsRate) {
  // The same ZeRO-1 candidate under the link's rate and under a slower reduce-scatter: its
  // step grows by what the gradients' reduce-scatter takes longer, nothing else.
  core::JobSpec s = test_util::gpt_spec(2, 64, 4, 256, 16);
  core::ModelGraph mg = build_planning_graph(s);
  Layout l;
  l.deg.dp = 2;
  l.zero = 1;
  l.micro_batch = 2, l.micro_batches = 2;
  l.chunk_layers = {2};
  CostModel fast;
  CostModel slow = fast;
  slow.coll_bw_by_size[size_t(CollKind::kReduceScatter)] = {{1, fast.bw_intra / 10}};
  const Crossing cross = crossing(l.deg, {Axis::kTp, Axis::kEp, Axis::kDp, Axis::kPp}, fast.ranks_per_node);
  auto step = [&](const CostModel& m) {
    const SplitCosts sc = split_costs(mg.graph, m, s.train.global_batch / 2, 1, 1, 2, cross);
    return predict(s.model, sc, l, m, cross, stage_in_flight(l.schedule, 1, 1, 2)).step_s;
  };
  const SplitCosts sc = split_costs(mg.graph, fast, s.train.global_batch / 2, 1, 1, 2, cross);
  double params = sc.embed_param_bytes + sc.head_param_bytes;
  for (double p : sc.param_bytes) params += p;
  // The tied embedding is one tensor where one stage holds both ends.
  EXPECT_EQ(sc.tied_param_bytes, double(s.model.vocab * s.model.dim) * sc.grad_elem);
  params -= sc.tied_param_bytes;
  const double wire = double(wire_bytes(CollKind::kReduceScatter, 2, int64_t(params)));
  EXPECT_NEAR(step(slow) - step(fast), wire * (10 - 1) / fast.bw_intra, 1e-3 * wire / fast.bw_intra);
}

TEST(CollectiveRates, TheHardwareFileKeepsTheCurves) {
  Hardware hw = load_hardware("h100");
  EXPECT_EQ(hw.cost_model("bf16").coll_bw_by_size, CostModel{}.coll_bw_by_size);  // presets: none
  hw.coll_bw_by_size = measured().coll_bw_by_size;
  const std::string text = hardware_to_yaml(hw);
  EXPECT_NE(text.find("collective_bw_by_size:"), std::string::npos) << text;
  Hardware back = hardware_from_yaml(text, "test");
  EXPECT_EQ(back.coll_bw_by_size, hw.coll_bw_by_size);
  // Communication does not depend on the job's dtype.
  EXPECT_EQ(back.cost_model("bf16").coll_bw_by_size, hw.coll_bw_by_size);
}

TEST(CollectiveRates, BadCurvesAreNamed) {
  const std::string base = hardware_to_yaml(load_hardware("h100"));
  auto field = [&](const std::string& extra) {
    return config_error([&] { hardware_from_yaml(base + extra, "test"); }).field();
  };
  EXPECT_EQ(field("collective_bw_by_size: {all_reduce: [[65536, 0]]}\n"),
            "hardware.collective_bw_by_size.all_reduce[0]");
  EXPECT_EQ(field("collective_bw_by_size: {all_gather: [[4096, 1e9], [1024, 1e9]]}\n"),
            "hardware.collective_bw_by_size.all_gather[1]");
  EXPECT_EQ(field("collective_bw_by_size: {reduce_scatter: 3}\n"), "hardware.collective_bw_by_size.reduce_scatter");
  EXPECT_EQ(field("collective_bw_by_size: {allreduce: [[1, 1]]}\n"), "hardware.collective_bw_by_size.allreduce");
}

TEST(CollectiveRates, ThePlanFileKeepsTheCurvesAndOmitsThemWhenUnmeasured) {
  core::JobSpec s = test_util::gpt_spec(2);
  core::ModelGraph mg = build_planning_graph(s);
  PlanOptions o;
  const std::string plain = plan_to_json(make_plan(s, mg.graph, 2, o));
  EXPECT_EQ(plain.find("coll_bw_by_size"), std::string::npos);
  o.cost.coll_bw_by_size = measured().coll_bw_by_size;
  Plan p = make_plan(s, mg.graph, 2, o);
  Plan q = plan_from_json(plan_to_json(p));
  EXPECT_EQ(q.costs.model.coll_bw_by_size, o.cost.coll_bw_by_size);
  EXPECT_EQ(plan_to_json(q), plan_to_json(p));
}

}  // namespace
}  // namespace weft::planner
