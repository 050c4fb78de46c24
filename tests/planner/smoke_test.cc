// Plans for small models across layouts pass validation.
#include <gtest/gtest.h>

#include "planner/validate.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {
using test_util::gpt_spec;

TEST(PlannerSmoke, DenseLayoutsValidate) {
  struct Case { int world; int64_t tp, pp; int zero; std::string sched; };
  for (Case c : std::vector<Case>{{1, 1, 1, 0, "1f1b"}, {2, 2, 1, 0, "1f1b"}, {2, 1, 2, 0, "1f1b"},
                                  {4, 2, 2, 0, "1f1b"}, {8, 2, 2, 1, "gpipe"}, {8, 2, 1, 3, "1f1b"}}) {
    core::JobSpec s = gpt_spec();
    s.parallel.tp = c.tp;
    s.parallel.pp = c.pp;
    s.parallel.zero = c.zero;
    s.parallel.pipeline.schedule = c.sched;
    SCOPED_TRACE("world " + std::to_string(c.world) + " tp " + std::to_string(c.tp) + " pp " +
                 std::to_string(c.pp) + " zero " + std::to_string(c.zero));
    core::ModelGraph mg = build_planning_graph(s);
    Plan p = make_plan(s, mg.graph, c.world);
    ValidationReport v = validate_plan(p, mg.graph);
    for (const std::string& e : v.errors) ADD_FAILURE() << e;
  }
}

}  // namespace
}  // namespace weft::planner
