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

struct TimelineOptions {
  // A time window in seconds from the step's start; zoom_end_s <= zoom_start_s: the whole
  // step. Spans are clipped to it; those outside are not drawn.
  double zoom_start_s = 0, zoom_end_s = 0;
  // Ranks to draw, in this order; empty: every rank up to 32, else the ranks of
  // data-parallel replica 0 (one pipeline x tp x ep group: the other replicas run the same
  // programs on other rows), at most 64 of them. The title says which were drawn.
  std::vector<int> ranks;
  // Above this many bars in a rank's row, neighbouring spans are aggregated: the window is
  // cut into this many bins, each drawn in the colour that took most of its time, adjacent
  // bins of one colour merged into one bar labelled with the number of spans it holds. So
  // a row never has more rectangles than this, however many micro-batches.
  int max_bars = 400;
};

// Every rank's schedule over time: forward, backward, recomputation, optimizer step,
// collectives and waiting, one row per rank, under a time axis (ticks in us, ms or s).
std::string timeline_svg(const Plan& plan, const std::vector<std::vector<Span>>& timeline,
                         const TimelineOptions& opt = {});

}  // namespace weft::planner
