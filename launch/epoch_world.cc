// An epoch's world, its trainers' part and their process groups (epoch_world.h).
#include "launch/epoch_world.h"

namespace weft::launch {

int EpochWorld::splits() const { return (train_comm ? 1 : 0) + (groups ? groups->splits() : 0); }

EpochWorld connect_epoch_world(const parallel::LaunchEnv& env, const EpochTrainers& trainers,
                               comm::Millis timeout, std::function<std::string()> cancelled,
                               int connections) {
  EpochWorld w;
  w.world = std::make_unique<parallel::WorkerWorld>(env, timeout, std::move(cancelled), connections);
  comm::Communicator& comm = w.world->comm();
  const int train_world = trainers.world > 0 ? trainers.world : env.world;
  // Departing nodes' workers (ranks train_world and up) only hand their state over: the
  // trainers get a communicator of their own. A leaving rank's split returns null.
  if (env.world > train_world) {
    w.train_comm = comm.split(env.rank < train_world ? 0 : comm::kNoColor, env.rank);
    if (env.rank >= train_world) return w;
  }
  if (trainers.plan) {
    const std::shared_ptr<const planner::Plan> plan = trainers.plan();
    // The groups keep no reference to the plan: the trainer checks they fit its own.
    w.groups = std::make_unique<parallel::ProcessGroups>(w.trainers(), *plan);
  }
  return w;
}

}  // namespace weft::launch
