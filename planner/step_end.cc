// The trainer's statistics exchange, priced for simulate_plan and the stage model alike.
#include "planner/step_end.h"

namespace weft::planner {

double trainer_exchange_s(const CostModel& cost, int world, double optimizer_s, bool cross_node) {
  if (world <= 1) return 0;
  // Every rank of the world is in these calls, so every one is runnable whatever the rest
  // of the step leaves idle (CostModel::active_ranks, as simulate_plan prices it).
  if (cost.active_ranks > 0) {
    CostModel all = cost;
    all.active_ranks = 0;
    return trainer_exchange_s(all, world, optimizer_s, cross_node);
  }
  // all_gather_values: one int64 count per rank, then that rank's statistics as f64 (the
  // loss and the gradient norm with their addend indices: 8 values on a dp rank).
  const int64_t counts = 8 * int64_t(world), values = 64 * int64_t(world);
  return cost.collective(CollKind::kAllGather, world, counts, cross_node, world) +
         cost.sync_wait(0, world, world) +
         cost.collective(CollKind::kAllGather, world, values, cross_node, world) +
         cost.sync_wait(optimizer_s, world, world);
}

}  // namespace weft::planner
