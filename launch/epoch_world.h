// What a membership epoch's entry connects before anything else, in one order on every
// rank of the epoch: the world, the trainers' part of it when nodes leave (their workers
// only hand their state over), and the trainers' process groups of the epoch's plan. The
// entry connects it, or takes it connected from WorldAhead when the change was known while
// the old world still trained; the same sequence of collectives either way, so ranks that
// built it ahead and ranks that did not meet on every split.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "parallel/launch_env.h"
#include "parallel/process_groups.h"
#include "planner/plan.h"

namespace weft::launch {

// The epoch's trainers: ranks [0, world) train (the rest leave), under `plan`.
struct EpochTrainers {
  int world = 0;  // 0: every rank of the epoch trains
  // The trainers' plan, asked on the connecting thread (planner::PlanCache::plan: made
  // ahead, usually); null: no process groups are built (the trainer splits its own).
  std::function<std::shared_ptr<const planner::Plan>()> plan;
};

struct EpochWorld {
  // Declared in the order they connect; destroyed the other way (a split before its parent).
  std::unique_ptr<parallel::WorkerWorld> world;
  std::unique_ptr<comm::Communicator> train_comm;   // when some ranks leave; null otherwise
  std::unique_ptr<parallel::ProcessGroups> groups;  // null on a leaving rank, or without a plan
  // What the trainer runs over: the trainers' part, or the whole world.
  comm::Communicator& trainers() { return train_comm ? *train_comm : world->comm(); }
  // The splits made after the world connected (the trainers' part and the groups').
  int splits() const;
};

// Connects the world of `env` (WorkerWorld: `cancelled` and `connections` as there), then
// the trainers' part and their groups. Collective over the epoch; throws the connect's or
// a split's CommError, and the plan's ConfigError.
EpochWorld connect_epoch_world(const parallel::LaunchEnv& env, const EpochTrainers& trainers,
                               comm::Millis timeout, std::function<std::string()> cancelled,
                               int connections);

}  // namespace weft::launch
