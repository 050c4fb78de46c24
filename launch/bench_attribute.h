// `weft bench scaling --attribute ROW`: one layout's measured time per instruction group
// (the executor's per-instruction timing) beside the simulator's price of the same
// instructions, so that a missing or underpriced term of the cost model shows where it sits.
#pragma once

#include <string>
#include <vector>

#include "planner/cost.h"

namespace weft::launch {

// Trains `config` with `sets` on `world` local ranks for `steps` steps under per-instruction
// timing, plans it under `cm`, and prints rank `rank`'s groups. Returns the exit code.
int attribute_layout(const std::string& config, const std::vector<std::string>& sets, int world, int steps,
                     const planner::CostModel& cm, int rank);

}  // namespace weft::launch
