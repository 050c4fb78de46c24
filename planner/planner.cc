// make_plan: the three phases in order.
#include "planner/planner.h"

#include <chrono>
#include <sstream>

#include "base/error.h"
#include "core/rng.h"
#include "planner/lower.h"
#include "planner/simulate.h"

namespace weft::planner {

core::ModelGraph build_planning_graph(const core::JobSpec& spec) {
  core::DType dt = spec.train.dtype == "bf16" ? core::DType::kBF16 : core::DType::kF32;
  core::ModelGraph mg = core::build_model(spec.model, spec.train.global_batch, dt);
  core::add_training_ops(mg, spec.train);
  return mg;
}

uint64_t shape_hash(const core::Graph& g, const ParallelConfig& pc) {
  std::ostringstream os;
  os << "batch " << pc.global_batch << " " << pc.micro_batch << "\n";
  for (const core::Value& v : g.values()) {
    os << v.name << " " << int(v.dtype);
    for (int64_t d : v.shape) os << " " << d;
    os << "\n";
  }
  for (const core::Op& op : g.ops()) {
    os << op.type;
    for (int v : op.inputs) os << " " << v;
    os << " ->";
    for (int v : op.outputs) os << " " << v;
    os << "\n";
  }
  return core::stable_hash(os.str());
}

PlanOptions training_plan_options(const CostModel& cost) {
  PlanOptions o;
  o.cost = cost;
  o.simulate = false;
  return o;
}

Plan make_plan(const core::JobSpec& spec, const core::Graph& g, int world, const PlanOptions& opt) {
  auto t0 = std::chrono::steady_clock::now();
  Plan plan;
  plan.config = resolve_parallel(spec, world);
  plan.mesh = Mesh(plan.config.deg, plan.config.order);
  // Phase 1: transformation decisions (backward ops follow their forward op).
  plan.decisions = decide_partitions(g, plan.config);
  // Phases 2 and 3: placement, ordering and communication, per role.
  GraphInfo gi(g, plan.config, plan.decisions);
  RvdCache own;
  lower_plan(gi, plan, opt.cost, opt.layout_cache ? *opt.layout_cache : own);
  build_groups(plan);
  plan.model_hash = core::model_config_hash(spec.model);
  plan.shape_hash = shape_hash(g, plan.config);
  if (opt.simulate) plan.costs = simulate_plan(plan, g, opt.cost);
  plan.costs.planning_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return plan;
}

Plan make_plan(const core::JobSpec& spec, int world, const PlanOptions& opt) {
  resolve_parallel(spec, world);  // bad settings fail before the graph is built
  core::ModelGraph mg = build_planning_graph(spec);
  return make_plan(spec, mg.graph, world, opt);
}

void check_plan_matches(const Plan& plan, const core::JobSpec& spec, const core::Graph& g) {
  uint64_t m = core::model_config_hash(spec.model), s = shape_hash(g, plan.config);
  if (plan.model_hash != m)
    throw ConfigError("plan", "the plan was made for another model (hash " + std::to_string(plan.model_hash) +
                                  ", this job " + std::to_string(m) + "); run weft plan again");
  if (plan.shape_hash != s)
    throw ConfigError("plan", "the plan was made for other shapes or batch sizes (hash " +
                                  std::to_string(plan.shape_hash) + ", this job " + std::to_string(s) +
                                  "); run weft plan again");
}

}  // namespace weft::planner
