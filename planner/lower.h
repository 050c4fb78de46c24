// Phases 2 and 3 together: placing every sub-op on a rank (assign), ordering them by the
// pipeline schedule, and preserving every data dependency by inserting the loads, local
// cuts, collectives, sends/receives, gradient synchronisation (DP, ZeRO-1/2/3), the
// optimizer step and the frees that make each role's program self-contained.
#pragma once

#include <set>
#include <vector>

#include "core/graph/graph.h"
#include "planner/plan.h"
#include "planner/rvd.h"
#include "planner/schedule.h"

namespace weft::planner {

// A value produced in one model chunk and read in another: it travels by send/recv at the
// end of the producing unit and the start of the first consuming unit.
struct Transfer {
  int value = -1;
  int src_chunk = 0, dst_chunk = 0;
  Dir src_dir = Dir::kForward, dst_dir = Dir::kForward;
};

// Facts about the graph that placement and lowering share, computed once per plan.
struct GraphInfo {
  GraphInfo(const core::Graph& g, const ParallelConfig& pc, const std::vector<OpDecision>& dec);

  const core::Graph& g;
  const ParallelConfig& pc;
  std::vector<int> op_chunk;        // op -> model chunk (backward ops: their mirror's); -1: optimizer
  std::vector<std::vector<int>> chunk_ops[2];  // [dir][chunk] -> ops in program order
  std::vector<int> decision;        // op -> index into the decisions (backward: the mirror's)
  std::vector<std::vector<int>> writers, readers;  // value -> ops
  std::vector<char> recompute;      // forward op -> re-run in its backward unit
  std::vector<Transfer> transfers;
  std::vector<int> adamw_of;        // parameter -> its adamw op
  std::vector<char> expert_param;   // parameter split over experts (its gradient syncs over dp only)
  std::vector<std::vector<int>> param_stages;  // parameter -> stages holding it, ascending
  std::vector<char> keep;           // values the trainer reads after the step (losses)
  std::vector<int> grad_value;      // parameter -> its gradient value
  int global_norm = -1;
  int param_of_grad(int value) const;  // -1 unless `value` is a parameter's gradient
};

// The stage (pipeline rank) that runs model chunk `chunk`: chunk % pp.
int assign_stage(const ParallelConfig& pc, int chunk);

// Builds plan.roles (every stage x lane) and registers the group families they use. Layout
// searches are looked up in and kept in `layouts` (the planner's own memo).
void lower_plan(const GraphInfo& gi, Plan& plan, const CostModel& cost, RvdCache& layouts);

}  // namespace weft::planner
