// Symbolic execution of every rank's program at once: the one engine behind the validator
// (dependencies, matching, ordering, memory) and the simulator (time under the cost model).
// Each rank runs until it blocks on a receive or a collective; a send deposits a message;
// a collective completes when every member of its group has reached its next collective
// on that group, which must have the same signature. No rank ever waits on wall time.
#pragma once

#include <cstdint>
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
  int32_t pc = -1;  // the instruction's position in its rank's program
};

// The work (FLOPs, bytes) of every compute instruction, per role and instruction (zero for
// other kinds): operand shapes resolved once, priced under each cost model a caller runs.
using PlanWork = std::vector<std::vector<OpWork>>;
PlanWork plan_work(const Plan& plan, const core::Graph& g);
// Per role and instruction, seconds (durations_alone below).
using PlanDurations = std::vector<std::vector<double>>;

// What one engine run decided besides times: the order it retired every rank's
// instructions in, which send each receive took and which ranks each collective joined.
// Times never change these (a receive takes its sender's oldest message with its tag, a
// collective each member's next arrival on the group), so retime() prices the same run
// under another cost model without matching or checking anything again.
struct EngineSchedule {
  struct Step {
    int rank = 0;         // >= 0: run this rank's instructions up to end_pc (not a collective);
    uint32_t end_pc = 0;  // < 0: collective -rank-1 completes for its members
  };
  std::vector<Step> steps;
  std::vector<int> recv_send;  // per receive, in retire order: the send (in send order) it takes
  std::vector<int> recv_peer;  // ... and its peer rank and bytes
  std::vector<int64_t> recv_bytes;
  std::vector<int> coll_begin;  // collective k's members: coll_ranks from coll_begin[k]
  std::vector<int> coll_ranks;  // to coll_begin[k + 1] (or the end)
  std::vector<int> coll_pricer;  // per collective, the member whose instruction prices it
  // Per collective, its price class: collectives of one class (the same group and kind,
  // bytes and extras of collective_seconds) take the same time under any cost model, so a
  // re-timing prices each class once, from an instruction of it (class_instr) on its group,
  // and adds each collective's CostModel::sync_wait from its members' bursts, as the engine.
  std::vector<int> coll_class;
  std::vector<const Instr*> class_instr;
  std::vector<int> class_group;
  // Per role and instruction, what retime() reads of most instructions: the kind (low bits)
  // and kStepWork for optimizer-step work. A byte per instruction to walk in each re-timing
  // instead of the instruction itself (168 bytes: most of a re-timing was its cache misses).
  static constexpr uint8_t kStepWork = 0x80;
  std::vector<std::vector<uint8_t>> codes;
};

struct EngineOptions {
  const CostModel* cost = nullptr;  // null: no timing (all instructions take no time)
  int64_t memory_budget = 0;        // bytes per rank; 0: unlimited
  bool timeline = false;            // record a Span per compute/communication instruction
  int max_errors = 20;
  // Run data-parallel replica 0 only. The other replicas run the same programs on other
  // rows and shards (planner/plan.h's symmetry), so under a cost model whose groups cross
  // nodes alike in every replica they keep the same times: a collective completes when
  // replica 0's members have arrived, and every rank gets its replica-0 twin's results.
  // Checks (matching, order, deadlock, memory) then cover replica 0's programs, and decide
  // every replica's: a run of all replicas in which replica d repeats replica 0's moves step
  // for step is a run of the full plan, and a full run restricted to replica 0 is a run of
  // this one, so both reach the same instructions (validate.cc checks the groups first).
  bool one_replica = false;
  // The compute instructions' work from plan_work (null: resolved here). A simulation that
  // runs the engine several times, or also prices the plan otherwise, resolves it once.
  const PlanWork* work = nullptr;
  // durations_alone under opt.cost (null: computed here). A simulation whose runs differ
  // only in cost->active_ranks computes them once.
  const PlanDurations* alone = nullptr;
  // Filled with the run's schedule (empty it first), for retime().
  EngineSchedule* record = nullptr;
};

struct EngineResult {
  std::vector<std::string> errors;  // empty: every check passed
  std::vector<RankCost> ranks;
  std::vector<std::vector<Span>> timeline;  // per rank, when requested
  double fb_end = 0;  // when the last forward/backward instruction of any rank ends
};

EngineResult run_programs(const Plan& plan, const core::Graph& g, const EngineOptions& opt);

// Per process group (by id), how many data-parallel replicas its ranks span: 1 for a group
// inside one replica, the dp degree for a gradient bucket's (CostModel::replica_drift).
std::vector<int> replicas_per_group(const Plan& plan);

// The result run_programs(plan, g, opt) gives, from `checked`, an error-free run of the same
// plan that recorded `schedule` with the same one_replica: its memory and volumes, and
// times under opt.cost (required) from one pass over the schedule. Bit for bit the same
// numbers, since every rank adds up its own instructions' times in program order either way.
EngineResult retime(const Plan& plan, const core::Graph& g, const EngineSchedule& schedule,
                    const EngineResult& checked, const EngineOptions& opt);

// Seconds each compute and local instruction of each role takes under `cost` on a rank
// alone on its node (others: 0); the engine multiplies them by cost.sharing(world).
PlanDurations durations_alone(const Plan& plan, const PlanWork& work, const CostModel& cost);
// Seconds collective `in` takes on a group of n ranks (cross: it spans nodes).
double collective_seconds(const Plan& plan, const core::Graph& g, const CostModel& cost,
                          const Instr& in, int n, bool cross);

// Local dense shapes of an instruction's operands.
std::vector<core::Shape> operand_shapes(const std::vector<TensorDesc>& tensors,
                                        const OperandList& ops);

}  // namespace weft::planner
