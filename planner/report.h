// What `weft plan` prints: the mesh and batch split, the final pipeline layout, which
// layers, experts and parameter shards live on which ranks, and the simulator's per-rank
// step time, peak memory, communication volume by kind and bubble; and the timeline SVG.
#pragma once

#include <string>
#include <vector>

#include "core/graph/graph.h"
#include "planner/engine.h"
#include "planner/plan.h"

namespace weft::planner {

struct ReportOptions {
  bool per_rank = false;  // one line per rank even for large worlds (default: per role above 64)
};

std::string plan_report(const Plan& plan, const core::Graph& g, const ReportOptions& opt = {});

// The final pipeline layout, one line per stage ("stage 0: embedding, layers 0-5").
std::string layout_lines(const Plan& plan);

// Every rank's schedule over time: forward, backward, recomputation, optimizer step,
// collectives and waiting, one row per rank.
std::string timeline_svg(const Plan& plan, const std::vector<std::vector<Span>>& timeline);

}  // namespace weft::planner
