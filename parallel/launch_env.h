// Where a worker process stands: its rank and world size and the rendezvous store, from
// `weft run` (WEFT_RANK, WEFT_WORLD_SIZE, WEFT_STORE_ADDR), Open MPI's mpirun
// (OMPI_COMM_WORLD_RANK/SIZE) or Slurm's srun (SLURM_PROCID/NTASKS; rank 0 hosts the store
// in both), and the world communicator built on it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace weft::comm {
class Store;
class TCPStoreServer;
}  // namespace weft::comm

namespace weft::parallel {

struct LaunchEnv {
  int rank = 0, world = 1, local_rank = 0;
  std::string launcher = "single";  // single | weft run | mpirun | srun
  std::string store_host = "127.0.0.1";
  uint16_t store_port = 0;
  bool host_store = false;  // this process serves the store (rank 0 under mpirun and srun)
  std::string bind_host;    // where the serving rank listens; "" = store_host
  // The job's identity that store_port was derived from (mpirun's PMIX_NAMESPACE, srun's
  // job.step); "" when the port was given (WEFT_STORE_PORT, WEFT_STORE_ADDR, weft run). With
  // it, a port that something else holds is no dead end: see agreed_store_ports.
  std::string store_job;
  // WEFT_STORE_PREFIX (weft run on several nodes: the membership epoch's store prefix), put
  // before the workers' keys so that they never meet the agents' rendezvous keys; "" = none.
  std::string store_prefix;
  // weft run only: which attempt this is (TORCHELASTIC_RESTART_COUNT: a restarted worker
  // resumes from the latest checkpoint), the membership epoch (WEFT_RDZV_EPOCH, 0 outside
  // an elastic job), the node count (GROUP_WORLD_SIZE) and the agent's range --nnodes
  // MIN:MAX (WEFT_NNODES; 0:0 when not given).
  int restart_count = 0;
  int64_t rdzv_epoch = 0;
  int nnodes = 1, nnodes_min = 0, nnodes_max = 0;
};

// Reads the environment, in this order: WEFT_* (weft run, which also sets torchrun's
// variables), then OMPI_* (mpirun, also inside a Slurm allocation), then SLURM_PROCID (srun).
// Under mpirun or srun without WEFT_STORE_ADDR rank 0 serves the store on WEFT_STORE_PORT,
// or on a port derived from the job's id (the same on every rank of one job without
// talking): mpirun on 127.0.0.1 (one machine); srun on the first host of the step's node
// list (SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST), listening on every interface when the
// step spans several nodes. torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, ...) without
// any of these describe a world that nobody started a store for: when they say more than one
// process, ConfigError explaining to launch with weft run instead (never trained as world 1).
// Throws ConfigError naming the variable for malformed values.
LaunchEnv detect_launch_env();

// The ports where rank 0 may serve the store, in the order it tries them: store_port alone when
// the port was given; else store_port and kAgreedPortTries - 1 more, each derived from
// store_job as store_port is, so every rank knows them without talking. A derived port may be
// taken by anything on the machine (a listener, or any connection's local port: a 20000-39999
// port is in Linux's ephemeral range half the time); rank 0 serves on the first it can bind,
// and the others find it by asking each in turn for the job's name (WorkerWorld).
inline constexpr int kAgreedPortTries = 8;
std::vector<uint16_t> agreed_store_ports(const LaunchEnv& env);

// This machine's address on the route to `host`: what peers there can reach it on, so
// that Gloo listens and publishes there (127.0.0.1 would send a peer on another machine to
// itself), and weft run's agents publish their workers' store there. A connected UDP socket
// asks the kernel's routing table; no packet is sent. "127.0.0.1" when `host` is loopback or
// does not resolve.
std::string address_toward(const std::string& host, uint16_t port);

// The first host of a Slurm node list: "node[01-04]" -> "node01", "a,b" -> "a",
// "node[1,3-5]" -> "node1", "r[1-2]-n[3-4]" -> "r1-n3". ConfigError naming `variable` for
// an empty or unbalanced list.
std::string slurm_first_host(const std::string& nodelist,
                             const std::string& variable = "SLURM_JOB_NODELIST");

// The world of one worker: the store (served here when env.host_store), a client, and the
// Gloo communicator over all ranks. Construction is collective and blocks until every rank
// joined, bounded by `timeout` (TimeoutError naming the missing side otherwise).
class WorkerWorld {
 public:
  // `cancelled` (optional): asked while the world is being built; a non-empty reason stops
  // the build with CommError (a live worker whose epoch a newer one replaced: some of its
  // ranks will never come).
  // `connections` (elastic.transfer_connections): when above 1 and the ranks are on more
  // than one host, connections - 1 more communicators over the same ranks are connected too,
  // for the state router's striped messages (parallel/transfer_connections.h); they go with
  // this world (its epoch).
  WorkerWorld(const LaunchEnv& env, comm::Millis timeout,
              std::function<std::string()> cancelled = {}, int connections = 1);
  ~WorkerWorld();
  comm::Communicator& comm() { return *comm_; }
  // The extra connections (empty with one connection or on one host), for
  // TransitionOptions::connections.
  std::vector<comm::Communicator*> connections() const;
  const LaunchEnv& env() const { return env_; }

 private:
  LaunchEnv env_;
  std::unique_ptr<comm::TCPStoreServer> server_;
  std::shared_ptr<comm::Store> store_;
  std::unique_ptr<comm::Communicator> comm_;
  std::vector<std::unique_ptr<comm::Communicator>> more_;
};

// Every rank's `stop` or-ed over the world (a Ctrl-C on one rank stops all at the same step).
// Collective.
bool agree_stop(comm::Communicator& world, bool stop);

}  // namespace weft::parallel
