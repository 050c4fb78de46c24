// The plan search (`parallel.plan: search`, or `auto` on any of tp, pp, ep, zero, the
// schedule, virtual_stages, the pipeline layout, recompute, sequence_parallel and
// train.micro_batch): the layout with the shortest predicted step that fits a per-rank
// memory cap, in Alpa's two levels. The inner level enumerates each stage's splits (tp, dp,
// ep, ZeRO stage, recompute, sequence parallelism, micro-batch, schedule and virtual
// stages); the outer one is a dynamic programme over stage boundaries (which layers each
// pipeline stage holds). Candidates are scored on the stage-level model of stage_cost.h,
// never lowered. Fixed keys stay fixed; the result is a pure function of (spec, world, cost
// model), ties broken by enumeration order, so every rank reaches the same choice.
//
// The executor runs uniform stages only (one tp x ep x dp submesh shape for every stage, the
// mesh of mesh.h), so the submesh size is world / pp for every stage: the outer level chooses
// pp and the layer boundaries, not a size per stage. Interleaved schedules keep the even
// layout resolve_parallel gives them (their chunks take turns on a stage, which the
// boundary programme does not model).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config/job_spec.h"
#include "planner/cost.h"
#include "planner/stage_cost.h"

namespace weft::planner {

struct SearchOptions {
  CostModel cost;
  int top = 5;  // candidates kept for the table
};

struct Candidate {
  Layout layout;
  Prediction pred;
  double tokens_per_s = 0;
};

struct SearchResult {
  std::vector<Candidate> top;  // best first; top[0] is the choice
  int64_t evaluated = 0;       // candidates costed
  int64_t fitting = 0;         // of which under the cap
  double cap_bytes = 0;
  std::string cap_source;  // "memory.limit_gib" or "the device memory"
  double seconds = 0;
};

// Whether fit_layout runs the search for this job: plan: search, or a searched key left auto
// (dp: auto alone only takes what the world leaves).
bool needs_search(const core::JobSpec& spec);

// The memory cap per rank: memory.limit_gib when set, else the cost model's device memory.
double search_cap_bytes(const core::JobSpec& spec, const CostModel& cost);

// Runs the search. Throws ConfigError on memory.limit_gib (naming the smallest memory any
// candidate needs) when nothing fits, or the first candidate's ConfigError when the fixed
// keys admit no layout at all.
SearchResult search_plan(const core::JobSpec& spec, int world, const SearchOptions& opt = {});

// `spec` with every searched key set to the candidate's choice (plan: manual, the layout
// written out when it was searched): a job resolve_parallel and make_plan take as it is.
core::JobSpec apply_layout(const core::JobSpec& spec, const Layout& l);

// The best candidate's job for `world` (fit_layout calls this for searched jobs).
core::JobSpec searched_spec(const core::JobSpec& spec, int world, const SearchOptions& opt = {});

// Megatron-style defaults on the same cost model, for comparison: tp = the GPUs of a node
// (the largest that divides the model), pp = the smallest that fits memory (1F1B, even
// layout, micro_batch 1, distributed optimizer = ZeRO-1, selective recompute, then full if
// nothing fits, sequence parallelism when tp > 1), dp the rest. Throws ConfigError when nothing fits.
Candidate megatron_baseline(const core::JobSpec& spec, int world, const SearchOptions& opt = {});

// The table `weft plan` and `weft train` print: one line per candidate (degrees, schedule,
// micro-batch, ZeRO, recompute, layers per stage, predicted step, tokens/s, memory, bubble).
std::string search_table(const SearchResult& r, int world);
std::string candidate_row(const Candidate& c);
// The searched candidate above the baseline, and the ratio of their predicted tokens/s.
std::string compare_table(const Candidate& searched, const Candidate& baseline);
std::string candidate_header();

}  // namespace weft::planner
