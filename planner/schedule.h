// Phase 2, the time half of space-time scheduling: the order in which each pipeline stage
// runs its (micro-batch, model chunk, forward|backward) units. GPipe, 1F1B and interleaved
// 1F1B are one rule with three inputs: the order of forward units, the order of backward
// units, and how many forwards run before the first backward (warm-up); after the warm-up
// forwards and backwards alternate until the forwards run out.
#pragma once

#include <string>
#include <vector>

#include "planner/cost.h"

namespace weft::planner {

enum class Dir : uint8_t { kForward, kBackward };

struct Unit {
  int mb = 0;     // micro-batch
  int chunk = 0;  // model chunk (chunk c runs on stage c % pp)
  Dir dir = Dir::kForward;
  bool operator==(const Unit& o) const = default;
};

// The units of `stage` in execution order. `schedule` is gpipe | 1f1b | interleaved;
// pp stages, v chunks per stage, m micro-batches (interleaved with v > 1 needs m % pp == 0).
std::vector<Unit> stage_schedule(const std::string& schedule, int pp, int v, int m, int stage);

// Warm-up forwards of `stage`: m*v (gpipe), pp-1-stage (1f1b), Megatron's
// 2*(pp-1-stage) + (v-1)*pp (interleaved), all capped at m*v.
int warmup_forwards(const std::string& schedule, int pp, int v, int m, int stage);

// Most micro-batches whose forward has run and backward has not, over the schedule.
int max_in_flight(const std::vector<Unit>& units);

// The stage boundaries' messages of a pipeline, timed as engine.cc's receive prices one:
// a message leaves when its sender's unit ends (before the sender's own part, `send`), and
// arrives `transfer` later plus CostModel::message_wait at the larger of two bursts: the
// sender's at the send and the receiver's at the receive. A stage's burst is its compute
// since its last synchronisation: it restarts at each message the stage receives and in
// each unit that runs a collective (a tensor/expert-parallel call, a ZeRO gather or
// reduce-scatter, the gradient reduction in a chunk's final backward), which ends with none
// (the compute after its last call is left out, as in the stage model's calls).
// The replicas' drift (CostModel::replica_drift) travels the same way: each unit adds its
// own calls' variance, and a receive takes the larger of the two stages' plus its wait's
// CostModel::wait_variance (a collective of two).
struct Boundaries {
  const CostModel* cost = nullptr;
  int world = 0;        // the candidate's ranks, for CostModel::message_wait
  double transfer = 0;  // CostModel::p2p of one boundary message
  double send = 0;      // CostModel::send_s of one, at the end of the unit that sends it
  std::vector<char> fwd_syncs, bwd_syncs;  // per chunk: the unit runs a collective
  std::vector<double> fwd_var, bwd_var;    // per chunk: the variance its own calls add
};

// Unit-level timing of a schedule: every forward of chunk c takes fwd[c], every backward
// bwd[c]; a forward waits for the previous chunk's forward of its micro-batch, a backward
// for the next chunk's backward (the last chunk's for its own forward). With `boundaries`,
// the messages between stages are timed as above; without, they cost nothing.
// `bwd_final` (optional, per chunk) adds to the backward unit that completes a chunk's
// gradients (its last in the stage's order): the blocking gradient reduction the lowering
// emits there, which delays the gradient sent on to the previous stage.
struct ScheduleTiming {
  double makespan = 0;
  std::vector<double> busy;    // per stage
  std::vector<double> bubble;  // per stage: 1 - busy / makespan
  std::vector<double> end;     // per stage: when its last unit ends
  // Per stage, with `boundaries`: the drift variance its replica ends its units with, and
  // its burst then (what its first collective after the pipeline waits at).
  std::vector<double> drift_var, end_burst;
};
ScheduleTiming time_schedule(const std::string& schedule, int pp, int v, int m,
                             const std::vector<double>& fwd, const std::vector<double>& bwd,
                             const std::vector<double>* bwd_final = nullptr,
                             const Boundaries* boundaries = nullptr);

}  // namespace weft::planner
