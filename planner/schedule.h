// Phase 2, the time half of space-time scheduling: the order in which each pipeline stage
// runs its (micro-batch, model chunk, forward|backward) units. GPipe, 1F1B and interleaved
// 1F1B are one rule with three inputs: the order of forward units, the order of backward
// units, and how many forwards run before the first backward (warm-up); after the warm-up
// forwards and backwards alternate until the forwards run out.
#pragma once

#include <string>
#include <vector>

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

// Unit-level timing of a schedule: every forward of chunk c takes fwd[c], every backward
// bwd[c]; a forward waits for the previous chunk's forward of its micro-batch, a backward
// for the next chunk's backward (the last chunk's for its own forward). No communication.
// `bwd_final` (optional, per chunk) adds to the backward unit that completes a chunk's
// gradients (its last in the stage's order): the blocking gradient reduction the lowering
// emits there, which delays the gradient sent on to the previous stage.
struct ScheduleTiming {
  double makespan = 0;
  std::vector<double> busy;    // per stage
  std::vector<double> bubble;  // per stage: 1 - busy / makespan
  // Per stage: when its last unit ends. With each unit's duration a quantity that adds along
  // a stage's units and meets by the larger at each dependency (a replica's drift,
  // stage_cost.cc), the quantity each stage ends with.
  std::vector<double> end;
};
ScheduleTiming time_schedule(const std::string& schedule, int pp, int v, int m,
                             const std::vector<double>& fwd, const std::vector<double>& bwd,
                             const std::vector<double>* bwd_final = nullptr);

}  // namespace weft::planner
