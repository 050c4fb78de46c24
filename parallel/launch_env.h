// Where a worker process stands: its rank and world size and the rendezvous store, from
// `weft run` (WEFT_RANK, WEFT_WORLD_SIZE, WEFT_STORE_ADDR) or Open MPI's mpirun
// (OMPI_COMM_WORLD_RANK/SIZE; rank 0 hosts the store), and the world communicator built on it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "comm/communicator.h"

namespace weft::comm {
class Store;
class TCPStoreServer;
}  // namespace weft::comm

namespace weft::parallel {

struct LaunchEnv {
  int rank = 0, world = 1, local_rank = 0;
  std::string launcher = "single";  // single | weft run | mpirun
  std::string store_host = "127.0.0.1";
  uint16_t store_port = 0;
  bool host_store = false;  // this process serves the store (rank 0 under mpirun)
};

// Reads the environment. WEFT_* wins over OMPI_*. Under mpirun without WEFT_STORE_ADDR the
// store is 127.0.0.1 on WEFT_STORE_PORT, or a port derived from the job's id (the same on
// every rank of one job). Throws ConfigError naming the variable for malformed values.
LaunchEnv detect_launch_env();

// The world of one worker: the store (served here when env.host_store), a client, and the
// Gloo communicator over all ranks. Construction is collective and blocks until every rank
// joined, bounded by `timeout` (TimeoutError naming the missing side otherwise).
class WorkerWorld {
 public:
  WorkerWorld(const LaunchEnv& env, comm::Millis timeout);
  ~WorkerWorld();
  comm::Communicator& comm() { return *comm_; }
  const LaunchEnv& env() const { return env_; }

 private:
  LaunchEnv env_;
  std::unique_ptr<comm::TCPStoreServer> server_;
  std::unique_ptr<comm::Store> store_;
  std::unique_ptr<comm::Communicator> comm_;
};

// Every rank's `stop` or-ed over the world (a Ctrl-C on one rank stops all at the same step).
// Collective.
bool agree_stop(comm::Communicator& world, bool stop);

}  // namespace weft::parallel
