// The ranks behind after a member died during a step's statistics exchange (issue 14): the
// exchange's all-gather delivered every piece to some survivors (they ran their update and
// hold step s+1) and not to others (they hold step s, its gradients reduced, stopped right
// before their update). Where the rest of the step program needs no peer
// (ParallelTrainer::can_finish_step), a rank behind finishes step s+1 itself with the
// statistics records a rank ahead got, so that the survivors hold step s+1 whole even
// under tp, pp, ep or ZeRO-3, where neither step alone is covered by the survivors.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "launch/live_resize.h"
#include "parallel/vps.h"
#include "planner/plan_cache.h"

namespace weft::launch {

// Which ranks of the new world finish a step, and with what.
struct RollForward {
  int64_t step = -1;        // the step the ranks behind finish (they then hold step + 1)
  std::vector<int> ranks;   // the new world's ranks that finish it
  int source = -1;          // the new world's rank whose records they take
  std::vector<double> records;  // the step's records, on the ranks that finish it
  bool mine = false;        // this rank is one of them
};

// Decided alike on every rank from `reports` (exchange_reports'; the first `world_size` are
// the ranks' live reports): the ranks that can finish their step s (HolderReport::unfinished)
// finish it when some rank holds step s+1 of the same epoch with the records of step s, and
// the holders of step s+1 then cover the state (choose_holders; finishing never uncovers a
// step that was covered, but it takes those ranks out of step s's group). Of several
// unfinished steps the latest. On a roll, every rank's `reports` say step s+1 for the ranks
// behind (what they hold once they finished), and the source's records reach them (one
// broadcast over `world`, only then: every rank knows from the reports). `held`: this rank's.
RollForward roll_forward(planner::PlanCache& plans, const parallel::StateSpace& space,
                         std::vector<HolderReport>& reports, int world_size,
                         comm::Communicator& world, const HeldState& held);

}  // namespace weft::launch
