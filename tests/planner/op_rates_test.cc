// The measured kernel rates of a calibrated CPU host (CostModel::op_rates): a whole op of a
// rated type is priced at its type's rate, every other op (and every op of an uncalibrated
// model) as before; the stage model's optimizer term and the simulator read them; the
// hardware file and the plan file keep them.
#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <set>
#include <utility>

#include "planner/engine.h"
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


// The first op of `type` in `g`: a whole op of that rated type, priced as before under
// `before` (no rate: FLOPs at the GEMM rate or bytes at memory bandwidth) and under `after`
// at exactly before's op_overhead + its FLOPs at after's rate for it, whatever the other
// types' rates.
void expect_priced_at_its_rate(const core::Graph& g, const char* type, const CostModel& before,
                               const CostModel& after) {
  const core::Op* op = first_op(g, type);
  ASSERT_TRUE(op) << type;
  const OpWork w = whole_work(g, *op);
  EXPECT_EQ(w.rated, rated_op(type)) << type;
  ASSERT_GT(w.flop, 0) << type;
  EXPECT_DOUBLE_EQ(before.compute_alone(w), before.compute_alone(w.flop, w.bytes)) << type;
  const double rate = after.op_rates[size_t(rated_op(type))];
  ASSERT_GT(rate, 0) << type;
  EXPECT_DOUBLE_EQ(after.compute_alone(w), before.op_overhead + w.flop / rate) << type;
  CostModel only = before;
  only.op_rates[size_t(rated_op(type))] = rate;
  EXPECT_DOUBLE_EQ(only.compute_alone(w), after.compute_alone(w)) << type;
}

// Llama's own kernels (weft calibrate times them on configs/llama-small.yaml's steps).
constexpr const char* kLlamaTypes[] = {"rmsnorm", "rmsnorm.bwd", "rope", "rope.bwd", "swiglu", "swiglu.bwd"};

core::JobSpec llama_spec() {
  core::JobSpec s = test_util::gpt_spec(2, 64, 8);
  s.model.arch = "llama";
  s.model.kv_heads = 2;
  return s;
}

TEST(OpRates, LlamasKernelsArePricedAtTheirCalibratedRates) {
  core::JobSpec s = llama_spec();
  core::ModelGraph mg = build_planning_graph(s);
  CostModel before;
  before.op_overhead = 3e-6;
  CostModel after = before;
  double rate = 1e9;
  for (const char* type : kLlamaTypes) after.op_rates[size_t(rated_op(type))] = rate, rate *= 1.5;
  for (const char* type : kLlamaTypes) expect_priced_at_its_rate(mg.graph, type, before, after);
}

TEST(OpRates, TheSimulatorPricesALlamaStepFromThem) {
  // A Llama plan's simulated step moves by exactly what its rmsnorm, rope and swiglu
  // instructions (forward and backward) take at the calibrated rates instead of before.
  core::JobSpec s = llama_spec();
  core::ModelGraph mg = build_planning_graph(s);
  PlanOptions o;
  Plan p = make_plan(s, mg.graph, 1, o);
  const double base = simulate_plan(p, mg.graph, o.cost).step_s;
  CostModel rated = o.cost;
  for (const char* type : kLlamaTypes) rated.op_rates[size_t(rated_op(type))] = 2e6;
  const PlanWork work = plan_work(p, mg.graph);  // each instruction's work on its own shapes
  double delta = 0;
  std::set<std::string> seen;
  for (size_t i = 0; i < p.roles.at(0).program.size(); ++i) {
    const Instr& in = p.roles.at(0).program[i];
    if (in.kind != InstrKind::kCompute || !in.part.empty()) continue;
    const core::Op& op = mg.graph.op(in.op);
    if (std::find(std::begin(kLlamaTypes), std::end(kLlamaTypes), op.type) == std::end(kLlamaTypes)) continue;
    delta += rated.compute_alone(work[0][i]) - o.cost.compute_alone(work[0][i]);
    seen.insert(op.type);
  }
  EXPECT_EQ(seen.size(), std::size(kLlamaTypes));
  ASSERT_GT(delta, 0);
  EXPECT_NEAR(simulate_plan(p, mg.graph, rated).step_s - base, delta, 1e-3 * delta);
}

TEST(OpRates, LlamasRatesRoundTripAndAFileWithoutThemKeepsTheOldPricing) {
  Hardware hw = load_hardware("h100");
  double rate = 2e9;
  for (const char* type : kLlamaTypes) hw.op_rates[size_t(rated_op(type))] = rate, rate += 1e9;
  const std::string yaml = hardware_to_yaml(hw);
  for (const char* type : kLlamaTypes)
    EXPECT_NE(yaml.find(std::string("  ") + type + ": "), std::string::npos) << type << "\n" << yaml;
  EXPECT_EQ(hardware_from_yaml(yaml, "test").op_rates, hw.op_rates);

  // An older cache: op_rates without Llama's types (as weft calibrate wrote before them).
  const Hardware old =
      hardware_from_yaml(hardware_to_yaml(load_hardware("h100")) + "op_rates: {gelu: 2.0e10, rmsnorm: 3.0e9}\n", "t");
  const CostModel m = old.cost_model("f32"), none = load_hardware("h100").cost_model("f32");
  core::JobSpec s = llama_spec();
  core::ModelGraph mg = build_planning_graph(s);
  for (const char* type : kLlamaTypes) {
    const OpWork w = whole_work(mg.graph, *first_op(mg.graph, type));
    if (std::string(type) == "rmsnorm")
      EXPECT_DOUBLE_EQ(m.compute_alone(w), w.flop / 3.0e9);
    else
      EXPECT_DOUBLE_EQ(m.compute_alone(w), none.compute_alone(w)) << type;
  }
}

}  // namespace
}  // namespace weft::planner

namespace weft::planner {
namespace {

// The MoE-GPT's fused layer (weft calibrate times it on configs/moe-layout.yaml's steps).
constexpr const char* kMoeTypes[] = {"moe", "moe.bwd"};

TEST(OpRates, TheMoeLayerIsPricedAtItsCalibratedRate) {
  core::JobSpec s = test_util::moe_spec(4, 2);
  core::ModelGraph mg = build_planning_graph(s);
  CostModel before;
  before.op_overhead = 3e-6;
  CostModel after = before;
  after.op_rates[size_t(rated_op("moe"))] = 3.7e10;
  after.op_rates[size_t(rated_op("moe.bwd"))] = 5.2e10;
  for (const char* type : kMoeTypes) expect_priced_at_its_rate(mg.graph, type, before, after);
  // The types before them keep their indices (a rate array's old entries mean what they meant).
  EXPECT_EQ(rated_op("global_norm"), 21);
  EXPECT_EQ(rated_op("moe"), 22);
  EXPECT_EQ(rated_op("moe.bwd"), 23);
}

// The simulated step's change when the MoE layer gets `rated`'s rates, and what the plan's
// whole MoE instructions take more at them (summed by plan_work on their own shapes).
struct MoeDelta {
  double step = 0, instrs = 0;
  int whole = 0, parts = 0;  // MoE compute instructions of rank 0: whole ops, custom-rule stages
};
MoeDelta moe_delta(const core::JobSpec& s, int world, const CostModel& base,
                   const CostModel& rated) {
  core::ModelGraph mg = build_planning_graph(s);
  PlanOptions o;
  o.cost = base;
  Plan p = make_plan(s, mg.graph, world, o);
  const PlanWork work = plan_work(p, mg.graph);
  MoeDelta d;
  for (size_t i = 0; i < p.roles.at(0).program.size(); ++i) {
    const Instr& in = p.roles.at(0).program[i];
    if (in.kind != InstrKind::kCompute) continue;
    const std::string& type = mg.graph.op(in.op).type;
    if (std::find(std::begin(kMoeTypes), std::end(kMoeTypes), type) == std::end(kMoeTypes))
      continue;
    (in.part.empty() ? d.whole : d.parts)++;
    d.instrs += rated.compute_alone(work[0][i]) - base.compute_alone(work[0][i]);
  }
  d.step = simulate_plan(p, mg.graph, rated).step_s - simulate_plan(p, mg.graph, base).step_s;
  return d;
}

// A cost model and the same with the MoE layer rated slower than the GEMM curve.
std::pair<CostModel, CostModel> moe_cost_models() {
  CostModel base;
  base.op_overhead = 3e-6;
  CostModel rated = base;
  rated.op_rates[size_t(rated_op("moe"))] = 2e8;
  rated.op_rates[size_t(rated_op("moe.bwd"))] = 3e8;
  return {base, rated};
}

TEST(OpRates, TheSimulatorPricesAMoeStepFromThem) {
  // At world 1 every MoE layer is one whole op: the step moves by exactly what those
  // instructions take more at the (slower than the GEMM curve) calibrated rates.
  const auto [base, rated] = moe_cost_models();
  core::JobSpec s = test_util::moe_spec(4, 2);
  const MoeDelta d = moe_delta(s, 1, base, rated);
  EXPECT_EQ(d.whole, 2 * 2 * 4);  // 2 layers, forward and backward, 4 micro-batches
  EXPECT_EQ(d.parts, 0);
  ASSERT_GT(d.instrs, 0);
  EXPECT_NEAR(d.step, d.instrs, 1e-3 * d.instrs);
}

TEST(OpRates, AnExpertParallelLayersStagesArePricedAtTheLayersRate) {
  // Under ep2 the layer runs as its custom rule's stages (route, experts, combine, with the
  // all_to_all_v between them): the fused op's own stage kernels run apart, so each is
  // priced at the layer's rate by its own FLOPs, and the step moves by what they take more.
  const auto [base, rated] = moe_cost_models();
  core::JobSpec s = test_util::moe_spec(4, 2);
  s.parallel.ep = 2;
  const MoeDelta d = moe_delta(s, 2, base, rated);
  // layers, forward and backward, 3 stages, 2 micro-batches (the batch is split over the ranks)
  EXPECT_EQ(d.parts, 2 * 2 * 3 * 2);
  EXPECT_EQ(d.whole, 0);
  ASSERT_GT(d.instrs, 0);
  EXPECT_NEAR(d.step, d.instrs, 1e-3 * d.instrs);

  // On the whole layer's shapes the three stages' FLOPs are the layer's: at the rate they
  // cost what the fused op costs, plus an instruction's overhead for each extra stage.
  core::ModelGraph mg = build_planning_graph(test_util::moe_spec(4, 2));
  for (const char* type : kMoeTypes) {
    const core::Op& op = *first_op(mg.graph, type);
    std::vector<core::Shape> ins, outs;
    for (int v : op.inputs) ins.push_back(mg.graph.value(v).shape);
    for (int v : op.outputs) outs.push_back(mg.graph.value(v).shape);
    double stages = 0;
    for (const char* part : {"moe.route", "moe.experts", "moe.combine"}) {
      const OpWork w = op_work(op, part, ins, outs, 4);
      EXPECT_EQ(w.rated, rated_op(type)) << type << " " << part;
      EXPECT_DOUBLE_EQ(rated.compute_alone(w),
                       3e-6 + w.flop / rated.op_rates[size_t(rated_op(type))]);
      stages += rated.compute_alone(w);
    }
    EXPECT_NEAR(stages, rated.compute_alone(whole_work(mg.graph, op)) + 2 * 3e-6, 1e-12) << type;
  }
}

TEST(OpRates, MoeRatesRoundTripAndAFileWithoutThemKeepsTheOldPricing) {
  Hardware hw = load_hardware("h100");
  hw.op_rates[size_t(rated_op("moe"))] = 3.7e10;
  hw.op_rates[size_t(rated_op("moe.bwd"))] = 5.2e10;
  const std::string yaml = hardware_to_yaml(hw);
  for (const char* type : kMoeTypes)
    EXPECT_NE(yaml.find(std::string("  ") + type + ": "), std::string::npos) << type << "\n"
                                                                             << yaml;
  EXPECT_EQ(hardware_from_yaml(yaml, "test").op_rates, hw.op_rates);

  // A cache weft calibrate wrote before the MoE layer was timed: its op_rates name only the
  // other types, and the layer is priced as before (GEMM curve or memory bandwidth).
  const Hardware old = hardware_from_yaml(
      hardware_to_yaml(load_hardware("h100")) + "op_rates: {gelu: 2.0e10, attention: 7.0e10}\n",
      "t");
  const CostModel m = old.cost_model("f32"), none = load_hardware("h100").cost_model("f32");
  core::JobSpec s = test_util::moe_spec(4, 2);
  core::ModelGraph mg = build_planning_graph(s);
  for (const char* type : kMoeTypes) {
    const OpWork w = whole_work(mg.graph, *first_op(mg.graph, type));
    EXPECT_DOUBLE_EQ(m.compute_alone(w), none.compute_alone(w)) << type;
    EXPECT_DOUBLE_EQ(m.compute_alone(w), m.compute_alone(w.flop, w.bytes)) << type;
  }
  // And the plan file keeps them.
  PlanOptions o;
  o.cost.op_rates = hw.op_rates;
  const Plan p = make_plan(s, mg.graph, 1, o);
  EXPECT_EQ(plan_from_json(plan_to_json(p)).costs.model.op_rates, hw.op_rates);

  // A plan written before the last two types were appended has two rates fewer: it loads,
  // those two unrated; one with a rate more than there are types is refused.
  const std::string json = plan_to_json(p);
  const size_t at = json.find("\"op_rates\":[");
  ASSERT_NE(at, std::string::npos);
  const size_t end = json.find(']', at);
  std::string rates = json.substr(at, end - at);
  const std::string shorter = rates.substr(0, rates.rfind(',', rates.rfind(',') - 1));
  auto want = hw.op_rates;
  want[want.size() - 1] = want[want.size() - 2] = 0;
  EXPECT_EQ(plan_from_json(json.substr(0, at) + shorter + json.substr(end)).costs.model.op_rates,
            want);
  EXPECT_THROW(plan_from_json(json.substr(0, at) + rates + ",1" + json.substr(end)), Error);
}

}  // namespace
}  // namespace weft::planner

namespace weft::planner {
namespace {

// A rated type timed at two shapes (op_rates_by_size): an op is priced at the curve's rate
// for its FLOPs, linear in log(FLOPs) between the points and clamped at the ends; op_rates
// serves a type without a curve, and a curve overrides it for its own type only.
TEST(OpRates, ARateBySizeIsInterpolatedInLogFlopsAndClampedAtItsEnds) {
  CostModel m;
  m.op_overhead = 3e-6;
  const int att = rated_op("attention"), gelu = rated_op("gelu");
  m.op_rates[size_t(att)] = 6e10;  // the single rate, config S's
  m.op_rates[size_t(gelu)] = 2e10;
  m.op_rates_by_size[size_t(att)] = {{1e5, 6e9}, {1e7, 6e10}};
  auto priced = [&](int type, double flop) {
    OpWork w;
    w.flop = flop, w.bytes = 1, w.rated = type;
    return m.compute_alone(w);
  };
  EXPECT_DOUBLE_EQ(priced(att, 1e5), 3e-6 + 1e5 / 6e9);
  EXPECT_DOUBLE_EQ(priced(att, 1e7), 3e-6 + 1e7 / 6e10);
  EXPECT_DOUBLE_EQ(priced(att, 1e6), 3e-6 + 1e6 / (0.5 * (6e9 + 6e10)));  // halfway in log
  EXPECT_DOUBLE_EQ(priced(att, 1e3), 3e-6 + 1e3 / 6e9);                   // clamped below
  EXPECT_DOUBLE_EQ(priced(att, 1e9), 3e-6 + 1e9 / 6e10);                  // and above
  EXPECT_DOUBLE_EQ(priced(gelu, 1e5), 3e-6 + 1e5 / 2e10);                 // no curve: op_rates
  EXPECT_DOUBLE_EQ(m.op_rate(att, 1e6), 0.5 * (6e9 + 6e10));
  EXPECT_EQ(m.op_rate(-1, 1e6), 0);
}

// The simulator reads the curve: a world-1 GPT step under a curve that halves attention's
// rate at every size moves by exactly the attention instructions' extra time.
TEST(OpRates, TheSimulatorPricesAttentionByItsSize) {
  core::JobSpec s = test_util::gpt_spec(2);
  core::ModelGraph mg = build_planning_graph(s);
  PlanOptions o;
  o.simulate = false;
  o.cost.cores = 1;
  const int att = rated_op("attention");
  o.cost.op_rates[size_t(att)] = 4e10;
  const Plan p = make_plan(s, mg.graph, 1, o);
  CostModel curve = o.cost;
  curve.op_rates_by_size[size_t(att)] = {{1.0, 2e10}, {1e12, 2e10}};
  double extra = 0;
  const PlanWork work = plan_work(p, mg.graph);
  for (size_t i = 0; i < p.roles[0].program.size(); ++i)
    if (work[0][i].rated == att) extra += work[0][i].flop / 2e10 - work[0][i].flop / 4e10;
  ASSERT_GT(extra, 0);
  EXPECT_NEAR(simulate_plan(p, mg.graph, curve).step_s - simulate_plan(p, mg.graph, o.cost).step_s, extra,
              1e-12);
}

// The hardware file and the plan file keep the curves; a bad point names its field.
TEST(OpRates, RatesBySizeRoundTripAndBadPointsNameTheField) {
  Hardware hw = load_hardware("h100");
  const int att = rated_op("attention");
  hw.op_rates[size_t(att)] = 6e10;
  hw.op_rates_by_size[size_t(att)] = {{1.5e5, 6.6e9}, {3.5e7, 6.7e10}};
  const Hardware back = hardware_from_yaml(hardware_to_yaml(hw), "test");
  EXPECT_EQ(back.op_rates_by_size, hw.op_rates_by_size);
  EXPECT_EQ(back.cost_model("f32").op_rates_by_size, hw.op_rates_by_size);
  EXPECT_EQ(back.cost_model("bf16").op_rates_by_size, CostModel{}.op_rates_by_size);  // f32 only
  EXPECT_EQ(hardware_to_yaml(load_hardware("h100")).find("op_rates_by_size"), std::string::npos);
  const std::string base = hardware_to_yaml(load_hardware("h100"));
  EXPECT_EQ(config_error([&] { hardware_from_yaml(base + "op_rates_by_size: {gelux: [[1, 1]]}\n", "t"); }).field(),
            "hardware.op_rates_by_size.gelux");
  EXPECT_EQ(
      config_error([&] { hardware_from_yaml(base + "op_rates_by_size: {attention: [[2, 1], [1, 1]]}\n", "t"); })
          .field(),
      "hardware.op_rates_by_size.attention[1]");
  EXPECT_EQ(config_error([&] { hardware_from_yaml(base + "op_rates_by_size: {attention: [[1, 0]]}\n", "t"); })
                .field(),
            "hardware.op_rates_by_size.attention[0]");

  core::JobSpec s = test_util::gpt_spec(2);
  core::ModelGraph mg = build_planning_graph(s);
  PlanOptions o;
  EXPECT_EQ(plan_to_json(make_plan(s, mg.graph, 1, o)).find("op_rates_by_size"), std::string::npos);
  o.cost = hw.cost_model("f32");
  const Plan p = make_plan(s, mg.graph, 1, o);
  const Plan q = plan_from_json(plan_to_json(p));
  EXPECT_EQ(q.costs.model.op_rates_by_size, hw.op_rates_by_size);
  EXPECT_EQ(plan_to_json(q), plan_to_json(p));
}

}  // namespace
}  // namespace weft::planner
