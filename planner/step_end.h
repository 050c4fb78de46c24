// What the multi-rank trainer adds to every rank's step beyond the plan's program: the
// statistics exchange of ParallelTrainer::step (parallel/trainer.cc all_gather_values), two
// all-gathers over the whole world (each rank's count, then its loss and gradient-norm
// values) right before the optimizer's first write. simulate_plan and the search's stage
// model both add trainer_exchange_s to the step, so `weft plan`, the search and the
// benchmarks predict what metrics step_ms measures.
#pragma once

#include "planner/cost.h"

namespace weft::planner {

// Seconds of the exchange on a world of `world` ranks (0 at world 1: nothing is sent), of
// which the first gather follows the gradient norm closely and the second is followed by
// `optimizer_s` seconds of the rank's own compute (AdamW on its share). Each is priced as
// CostModel::collective plus CostModel::sync_wait: the first at no burst, the second at the
// optimizer's. The wait is read at the compute that FOLLOWS the second call because that is
// where a dp2 step measured it: the rank that leaves the call first computes the optimizer
// on one core while its peer, still to be woken in the same call, waits for the other
// (docs/planner.md, "the trainer's statistics exchange"); the calibration's loop, whose
// bursts before and after each call are equal, measures that wait at each length.
// `cross_node`: the world spans nodes.
double trainer_exchange_s(const CostModel& cost, int world, double optimizer_s, bool cross_node);

}  // namespace weft::planner
