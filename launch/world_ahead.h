// Worlds built ahead of a change known in advance (issue 14): when the agent's notice of a
// new epoch arrives while the old world is still in its step (a graceful leave, a node
// admitted: nobody was lost, so nothing is aborted), the worker connects the new epoch's
// world on a thread, and the old world finishes its step meanwhile. At the step boundary
// the entry takes the connected world instead of building it: the communicators cost the
// resize nothing. On GPUs, where a communicator takes seconds to create (NCCL's init), this
// is the point; on loopback Gloo it is tens of milliseconds.
//
// A newcomer's world, or one whose change lost a member (its collectives are aborted at
// once and there is no step to overlap), is built in the entry as before; every rank of one
// epoch reaches the same world either way (the same store prefix and keys).
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "parallel/launch_env.h"

namespace weft::launch {

class WorldAhead {
 public:
  WorldAhead() = default;
  // Cancels the builds still running and joins them: each ends within 10 ms while it waits
  // on the store for its peers' keys (a worker that ends with its job while a node was being
  // admitted must not wait out the timeout); one whose pairs were already connecting ends
  // when they connect or fail (Gloo's connect cannot be cancelled).
  ~WorldAhead();
  WorldAhead(const WorldAhead&) = delete;
  WorldAhead& operator=(const WorldAhead&) = delete;

  // Starts building the world of `env` (its epoch: env.rdzv_epoch) on a thread, unless a
  // build of that epoch or a later one was started already. The build gives up when the
  // notice file `notices` names a later epoch (that world's ranks will not all come).
  // Thread-safe.
  void start(const parallel::LaunchEnv& env, const std::string& notices, comm::Millis timeout);

  // The world of `epoch` if its build was started: waits for it, and rethrows its error
  // (CommError: the caller then waits for the next epoch, as when building it itself
  // fails). nullptr when none was started for `epoch`. Drops finished builds of earlier
  // epochs.
  std::unique_ptr<parallel::WorkerWorld> take(int64_t epoch);

 private:
  struct Build {
    int64_t epoch = 0;
    std::thread thread;
    std::atomic<bool> done{false};
    std::shared_ptr<std::atomic<bool>> cancelled = std::make_shared<std::atomic<bool>>(false);
    std::unique_ptr<parallel::WorkerWorld> world;  // written by `thread`, read after its join
    std::exception_ptr error;
  };
  void drop_finished_before(int64_t epoch);  // with mu_ held

  std::mutex mu_;
  std::vector<std::unique_ptr<Build>> builds_;
};

}  // namespace weft::launch
