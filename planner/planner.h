// The planner's entry point: JobSpec + world size -> Plan, through the three phases
// (transformation, space-time scheduling, dependency preservation), then grouped, hashed,
// optionally validated and simulated.
#pragma once

#include <cstdint>
#include <memory>

#include "core/config/job_spec.h"
#include "core/models/gpt.h"
#include "planner/plan.h"
#include "planner/rvd.h"

namespace weft::planner {

struct PlanOptions {
  CostModel cost;
  bool simulate = true;  // fill Plan::costs
  // The planner's memo of layout searches (RvdCache), shared by the plans made with these
  // options (a PlanCache's worlds); null: make_plan uses one of its own for this plan.
  std::shared_ptr<RvdCache> layout_cache;
};

// The options every trainer plans with (ParallelTrainer, PlanCache), under `cost`: the job's
// cost model, one for every rank and every world of a job (weft train's rank 0 chooses it,
// this machine's calibration when its cache exists, and hands it to the others through the
// job's store: launch/job_cost_model.h), CostModel's defaults when none is given. The
// lowering picks its layout conversions and gradient buckets by cost, so a plan made under
// another model is another program: ranks that planned under different models would run
// programs that do not meet. No simulation (a trainer reads no costs); to predict what a
// job runs, plan with these options and price that plan under a model (simulate_plan), as
// `weft bench scaling` does.
PlanOptions training_plan_options(const CostModel& cost = CostModel{});

// The training graph as the planner sees it: batch dim = the global batch, so that data
// parallelism and micro-batching are partitions of it. Value and op ids are the same as
// in the per-micro-batch graph an executor builds with build_model(spec, micro_batch).
core::ModelGraph build_planning_graph(const core::JobSpec& spec);

// Throws ConfigError for parallel settings that do not fit the world or the model.
Plan make_plan(const core::JobSpec& spec, const core::Graph& g, int world,
               const PlanOptions& opt = {});
Plan make_plan(const core::JobSpec& spec, int world, const PlanOptions& opt = {});

// Hash of every value's name, shape and dtype and every op's type and operands, with the
// batch sizes; a plan records it.
uint64_t shape_hash(const core::Graph& g, const ParallelConfig& pc);

// Refuses a plan written for another model or other shapes (ConfigError on "plan").
void check_plan_matches(const Plan& plan, const core::JobSpec& spec, const core::Graph& g);

}  // namespace weft::planner
