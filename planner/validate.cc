// Validation through the symbolic engine, without timing.
#include "planner/validate.h"

#include "base/error.h"
#include "planner/engine.h"

namespace weft::planner {

ValidationReport validate_plan(const Plan& plan, const core::Graph& g, int64_t memory_budget) {
  EngineOptions opt;
  opt.memory_budget = memory_budget;
  EngineResult r = run_programs(plan, g, opt);
  ValidationReport rep;
  rep.errors = std::move(r.errors);
  rep.ok = rep.errors.empty();
  for (const RankCost& c : r.ranks) rep.peak_bytes.push_back(c.peak_bytes);
  return rep;
}

void require_valid(const Plan& plan, const core::Graph& g, int64_t memory_budget) {
  ValidationReport rep = validate_plan(plan, g, memory_budget);
  if (rep.ok) return;
  std::string msg = "plan fails validation:";
  for (const std::string& e : rep.errors) msg += "\n  " + e;
  throw InternalError(msg);
}

}  // namespace weft::planner
