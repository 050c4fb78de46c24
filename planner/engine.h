// Symbolic execution of every rank's program at once: the one engine behind the validator
// (dependencies, matching, ordering, memory) and the simulator (time under the cost model).
// Each rank runs until it blocks on a receive or a collective; a send deposits a message;
// a collective completes when every member of its group has reached its next collective
// on that group, which must have the same signature. No rank ever waits on wall time.
#pragma once

#include <string>
#include <vector>

#include "core/graph/graph.h"
#include "planner/plan.h"

namespace weft::planner {

struct Span {
  double start = 0, end = 0;
  InstrKind kind = InstrKind::kCompute;
  Stage stage = Stage::kForward;
  int mb = -1, chunk = -1;
  bool recompute = false;
};

// The work (FLOPs, bytes) of every compute instruction, per role and instruction (zero for
// other kinds): operand shapes resolved once, priced under each cost model a caller runs.
using PlanWork = std::vector<std::vector<OpWork>>;
PlanWork plan_work(const Plan& plan, const core::Graph& g);

struct EngineOptions {
  const CostModel* cost = nullptr;  // null: no timing (all instructions take no time)
  int64_t memory_budget = 0;        // bytes per rank; 0: unlimited
  bool timeline = false;            // record a Span per compute/communication instruction
  int max_errors = 20;
  // Run data-parallel replica 0 only. The other replicas run the same programs on other
  // rows and shards (planner/plan.h's symmetry), so under a cost model whose groups cross
  // nodes alike in every replica they keep the same times: a collective completes when
  // replica 0's members have arrived, and every rank gets its replica-0 twin's results.
  // Checks (matching, order, memory) then cover replica 0's programs; validation runs all.
  bool one_replica = false;
  // The compute instructions' work from plan_work (null: resolved here). A simulation that
  // runs the engine several times, or also prices the plan otherwise, resolves it once.
  const PlanWork* work = nullptr;
};

struct EngineResult {
  std::vector<std::string> errors;  // empty: every check passed
  std::vector<RankCost> ranks;
  std::vector<std::vector<Span>> timeline;  // per rank, when requested
  double fb_end = 0;  // when the last forward/backward instruction of any rank ends
};

EngineResult run_programs(const Plan& plan, const core::Graph& g, const EngineOptions& opt);

// Local dense shapes of an instruction's operands.
std::vector<core::Shape> operand_shapes(const std::vector<TensorDesc>& tensors,
                                        const std::vector<Operand>& ops);

}  // namespace weft::planner
