// Validation through the symbolic engine, without timing.
#include "planner/validate.h"

#include "base/error.h"
#include "planner/engine.h"

namespace weft::planner {
namespace {

// Whether every process group is the one build_groups derives from its family: then the
// map (stage, lane, dp) -> (stage, lane, dp') carries every rank's program, groups and peers
// onto another replica's, and running data-parallel replica 0 alone decides every rank's
// verdict (engine.h, one_replica). A plan whose groups were edited by hand runs in full.
bool groups_follow_families(const Plan& plan) {
  Plan derived;
  derived.mesh = plan.mesh;
  derived.families = plan.families;
  build_groups(derived);
  if (derived.groups.size() != plan.groups.size()) return false;
  for (size_t i = 0; i < plan.groups.size(); ++i)
    if (plan.groups[i].id != int(i) || plan.groups[i].ranks != derived.groups[i].ranks)
      return false;
  for (size_t f = 0; f < plan.families.size(); ++f)
    if (plan.families[f].first_group != derived.families[f].first_group) return false;
  return true;
}

}  // namespace

ValidationReport validate_plan(const Plan& plan, const core::Graph& g, int64_t memory_budget) {
  EngineOptions opt;
  opt.memory_budget = memory_budget;
  opt.one_replica = groups_follow_families(plan);
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
