// The measured kernel rates of a calibrated CPU host (CostModel::op_rates): a whole op of a
// rated type is priced at its type's rate, every other op (and every op of an uncalibrated
// model) as before; the stage model's optimizer term and the simulator read them; the
// hardware file and the plan file keep them.
#include <gtest/gtest.h>

#include "planner/hardware.h"
#include "planner/plan_json.h"
#include "planner/planner.h"
#include "planner/simulate.h"
#include "planner/stage_cost.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {
using test_util::config_error;

const core::Op* first_op(const core::Graph& g, const std::string& type) {
  for (const core::Op& op : g.ops())
    if (op.type == type) return &op;
  return nullptr;
}

OpWork whole_work(const core::Graph& g, const core::Op& op) {
  std::vector<core::Shape> ins, outs;
  for (int v : op.inputs) ins.push_back(g.value(v).shape);
  for (int v : op.outputs) outs.push_back(g.value(v).shape);
  return op_work(op, "", ins, outs, 4);
}

TEST(OpRates, WholeOpsOfRatedTypesAreMarkedAndPricedAtTheirRate) {
  core::JobSpec s = test_util::gpt_spec(2);
  core::ModelGraph mg = build_planning_graph(s);
  const core::Op* gelu = first_op(mg.graph, "gelu");
  const core::Op* linear = first_op(mg.graph, "linear");
  ASSERT_TRUE(gelu && linear);
  const OpWork wg = whole_work(mg.graph, *gelu), wl = whole_work(mg.graph, *linear);
  EXPECT_EQ(wg.rated, rated_op("gelu"));
  EXPECT_EQ(wl.rated, -1);  // GEMMs go by flops_by_size
  std::vector<core::Shape> ins = {mg.graph.value(gelu->inputs[0]).shape};
  EXPECT_EQ(op_work(*gelu, "part", ins, ins, 4).rated, -1);  // a custom rule's stage
  CostModel m;
  m.op_overhead = 2e-6;
  // Unmeasured: as any op (FLOPs at the GEMM rate or bytes at memory bandwidth).
  EXPECT_DOUBLE_EQ(m.compute_alone(wg), m.compute_alone(wg.flop, wg.bytes));
  m.op_rates[size_t(rated_op("gelu"))] = 2e10;
  EXPECT_DOUBLE_EQ(m.compute_alone(wg), 2e-6 + wg.flop / 2e10);
  EXPECT_DOUBLE_EQ(m.compute_alone(wl), m.compute_alone(wl.flop, wl.bytes));
  m.cores = 1;  // shared like any compute: two ranks on one core take twice as long
  EXPECT_DOUBLE_EQ(m.compute(wg, 2), 2 * m.compute_alone(wg));
}

TEST(OpRates, TheOptimizerTermIsPricedAtAdamwsRate) {
  // One rank updating every parameter: halving adamw's rate adds what the update took.
  core::JobSpec s = test_util::gpt_spec(2, 64, 4, 256, 16);
  core::ModelGraph mg = build_planning_graph(s);
  Layout l;
  l.micro_batch = 2, l.micro_batches = 4;
  l.chunk_layers = {2};
  CostModel fast;
  fast.op_rates[size_t(rated_op("adamw"))] = 8e9;
  CostModel slow = fast;
  slow.op_rates[size_t(rated_op("adamw"))] = 4e9;
  const Crossing cross = crossing(l.deg, {Axis::kTp, Axis::kEp, Axis::kDp, Axis::kPp}, fast.ranks_per_node);
  const SplitCosts sc = split_costs(mg.graph, fast, s.train.global_batch, 1, 1, 2, cross);
  double params = sc.embed_param_bytes + sc.head_param_bytes;
  for (double p : sc.param_bytes) params += p;
  // The tied embedding is one tensor where one stage holds both ends.
  EXPECT_EQ(sc.tied_param_bytes, double(s.model.vocab * s.model.dim) * sc.grad_elem);
  params -= sc.tied_param_bytes;
  const double n = params / sc.grad_elem;
  auto step = [&](const CostModel& m) {
    return predict(s.model, sc, l, m, cross, stage_in_flight(l.schedule, 1, 1, 4)).step_s;
  };
  EXPECT_NEAR(step(slow) - step(fast), 15 * n / 4e9 - 15 * n / 8e9, 1e-12);
}

TEST(OpRates, TheSimulatorReadsThem) {
  // A slower gelu lengthens the simulated step by the gelu instructions' extra time.
  core::JobSpec s = test_util::gpt_spec(2);
  core::ModelGraph mg = build_planning_graph(s);
  PlanOptions o;
  Plan p = make_plan(s, mg.graph, 1, o);
  const double base = simulate_plan(p, mg.graph, o.cost).step_s;
  CostModel slow = o.cost;
  slow.op_rates[size_t(rated_op("gelu"))] = 1e6;
  double extra = 0;
  for (const Instr& in : p.roles.at(0).program)
    if (in.kind == InstrKind::kCompute && mg.graph.op(in.op).type == "gelu" && in.part.empty()) {
      OpWork w = whole_work(mg.graph, mg.graph.op(in.op));
      w.flop = w.flop * double(s.train.micro_batch) / double(s.train.global_batch);  // one micro-batch
      extra += slow.compute_alone(w) - o.cost.compute_alone(w);
    }
  ASSERT_GT(extra, 0);
  EXPECT_NEAR(simulate_plan(p, mg.graph, slow).step_s - base, extra, 1e-3 * extra);
}

TEST(OpRates, TheHardwareAndPlanFilesKeepThem) {
  Hardware hw = load_hardware("h100");
  hw.op_rates[size_t(rated_op("adamw"))] = 8e9;
  hw.op_rates[size_t(rated_op("attention"))] = 9e10;
  Hardware back = hardware_from_yaml(hardware_to_yaml(hw), "test");
  EXPECT_EQ(back.op_rates, hw.op_rates);
  EXPECT_EQ(back.cost_model("f32").op_rates, hw.op_rates);
  EXPECT_EQ(back.cost_model("bf16").op_rates, CostModel{}.op_rates);  // measured in f32 only
  EXPECT_EQ(config_error([&] { hardware_from_yaml(hardware_to_yaml(load_hardware("h100")) + "op_rates: {gelux: 1}\n", "t"); }).field(),
            "hardware.op_rates.gelux");

  core::JobSpec s = test_util::gpt_spec(2);
  core::ModelGraph mg = build_planning_graph(s);
  PlanOptions o;
  EXPECT_EQ(plan_to_json(make_plan(s, mg.graph, 1, o)).find("op_rates"), std::string::npos);
  o.cost.op_rates = hw.op_rates;
  Plan p = make_plan(s, mg.graph, 1, o);
  Plan q = plan_from_json(plan_to_json(p));
  EXPECT_EQ(q.costs.model.op_rates, hw.op_rates);
  EXPECT_EQ(plan_to_json(q), plan_to_json(p));
}

}  // namespace
}  // namespace weft::planner
