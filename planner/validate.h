// The validator: runs every rank's program symbolically and proves the plan executable:
// every receive has its send (same size), every process group's members issue the same
// collectives in the same order, no rank deadlocks, every operand is produced before use
// and not used after it is freed, and each rank's peak memory fits the budget.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/graph/graph.h"
#include "planner/plan.h"

namespace weft::planner {

struct ValidationReport {
  bool ok = false;
  std::vector<std::string> errors;
  std::vector<int64_t> peak_bytes;  // per rank
};

// `memory_budget`: bytes per rank, 0 for no limit.
ValidationReport validate_plan(const Plan& plan, const core::Graph& g, int64_t memory_budget = 0);

// Throws InternalError listing the first problems when the plan fails validation (the
// executor refuses such a plan).
void require_valid(const Plan& plan, const core::Graph& g, int64_t memory_budget = 0);

}  // namespace weft::planner
