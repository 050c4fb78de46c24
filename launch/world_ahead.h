// Worlds built ahead of a change known in advance (issue 14): when the agent's notice of a
// new epoch arrives while the old world is still in its step (a graceful leave, a node
// admitted: nobody was lost, so nothing is aborted), the worker connects the new epoch's
// world on a thread, and the old world finishes its step meanwhile. At the step boundary
// the entry takes the connected world instead of building it, with its trainers' part and
// their process groups of the epoch's plan (epoch_world.h: one split each for tp, pp, ep,
// ZeRO layouts, 15-70 ms of a resize on loopback): the communicators cost the resize nothing. On GPUs, where a communicator takes seconds to create (NCCL's init), this
// is the point; on loopback Gloo it is tens of milliseconds.
//
// A newcomer's world, or one whose change lost a member (its collectives are aborted at
// once and there is no step to overlap), is built in the entry as before; every rank of one
// epoch reaches the same world either way (the same store prefix and keys).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "launch/epoch_world.h"
#include "parallel/launch_env.h"

namespace weft::launch {

class WorldAhead {
 public:
  // Starts the builder thread: with the worker, not with its first build, so that the
  // worker's threads are the same whether or not (and whenever) a change is known ahead
  // (LiveResizeSoak counts them after every change).
  WorldAhead();
  // Cancels the builds not finished and joins the builder: a build ends within 10 ms while
  // it waits on the store for its peers' keys (a worker that ends with its job while a node
  // was being admitted must not wait out the timeout); one whose pairs were already
  // connecting ends when they connect or fail (Gloo's connect cannot be cancelled).
  ~WorldAhead();
  WorldAhead(const WorldAhead&) = delete;
  WorldAhead& operator=(const WorldAhead&) = delete;

  // Queues the build of the world of `env` (its epoch: env.rdzv_epoch), unless a build of
  // that epoch or a later one was queued already. The build gives up when the notice file
  // `notices` names a later epoch (that world's ranks will not all come). Builds run one at
  // a time on one thread that lives as long as this object: a thread per build left each
  // build's allocations in a fresh malloc arena, and a worker's memory grew with every
  // change (the 20-change soak test saw it). Thread-safe.
  // `connections`: WorkerWorld's (elastic.transfer_connections). `trainers`: which ranks
  // train and under which plan (connect_epoch_world); by default all, without groups.
  void start(const parallel::LaunchEnv& env, const std::string& notices, comm::Millis timeout,
             int connections = 1, EpochTrainers trainers = {});

  // The world of `epoch` (with its trainers' part and process groups) if its build was
  // queued: waits for it, and rethrows its error
  // (CommError: the caller then waits for the next epoch, as when building it itself
  // fails). nullptr when none was queued for `epoch`. Forgets finished builds of earlier
  // epochs.
  std::unique_ptr<EpochWorld> take(int64_t epoch);

 private:
  struct Build {
    int64_t epoch = 0;
    parallel::LaunchEnv env;
    std::string notices;
    comm::Millis timeout{0};
    int connections = 1;
    EpochTrainers trainers;
    bool done = false;  // under mu_
    std::shared_ptr<std::atomic<bool>> cancelled = std::make_shared<std::atomic<bool>>(false);
    std::unique_ptr<EpochWorld> world;  // set by the builder before `done`
    std::exception_ptr error;
  };
  void build_loop();
  static void build(Build& b);

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::vector<std::shared_ptr<Build>> builds_;   // queued, running or finished, not taken
  std::vector<std::shared_ptr<Build>> pending_;  // queued, in order
  std::thread builder_;                          // from construction to destruction
};

}  // namespace weft::launch
