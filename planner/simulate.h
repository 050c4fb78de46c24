// The simulator: predicted step time, compute and communication time, communication volume
// by kind, peak memory and pipeline bubble per rank, from the symbolic engine under the
// alpha-beta cost model; plus the analytic pipeline cross-check.
#pragma once

#include <vector>

#include "core/graph/graph.h"
#include "planner/engine.h"
#include "planner/plan.h"

namespace weft::planner {

// Fills and returns the cost annotations; `timeline` (optional) receives every rank's
// spans for drawing.
CostAnnotations simulate_plan(const Plan& plan, const core::Graph& g, const CostModel& cost,
                              std::vector<std::vector<Span>>* timeline = nullptr);

// Sum over stages of one micro-batch's forward+backward time, plus (m-1) x the slowest
// stage, plus the optimizer step: the classic pipeline estimate (exact for GPipe and 1F1B
// when stages are compute-bound and communication is free).
// `stage_s` (optional) receives each stage's per-micro-batch time.
// `work`: the compute instructions' work (plan_work).
double pipeline_estimate(const Plan& plan, const PlanWork& work, const CostModel& cost,
                         std::vector<double>* stage_s = nullptr);

}  // namespace weft::planner
