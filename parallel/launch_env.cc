// Launch environments (weft run, mpirun) and the worker's world communicator.
#include "parallel/launch_env.h"

#include <cstdlib>

#include "base/env.h"
#include "base/error.h"
#include "comm/registry.h"
#include "comm/store/auth.h"
#include "comm/store/tcp_store.h"
#include "comm/store/tcp_store_server.h"
#include "core/rng.h"

namespace weft::parallel {

namespace {

int env_rank(const char* name, int64_t fallback, int64_t lo, int64_t hi) {
  int64_t v = env_int(name, fallback);
  if (v < lo || v > hi)
    throw ConfigError(name, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                                "], got " + std::to_string(v));
  return int(v);
}

void parse_addr(const std::string& addr, LaunchEnv& e) {
  size_t colon = addr.rfind(':');
  if (colon == std::string::npos || colon == 0)
    throw ConfigError("WEFT_STORE_ADDR", "expected HOST:PORT, got '" + addr + "'");
  e.store_host = addr.substr(0, colon);
  try {
    int p = std::stoi(addr.substr(colon + 1));
    if (p <= 0 || p > 65535) throw std::out_of_range("port");
    e.store_port = uint16_t(p);
  } catch (const std::exception&) {
    throw ConfigError("WEFT_STORE_ADDR",
                      "expected HOST:PORT with a port in 1..65535, got '" + addr + "'");
  }
}

}  // namespace

LaunchEnv detect_launch_env() {
  LaunchEnv e;
  std::string addr = env_string("WEFT_STORE_ADDR", "");
  if (!env_string("WEFT_WORLD_SIZE", "").empty()) {
    e.launcher = "weft run";
    e.world = env_rank("WEFT_WORLD_SIZE", 1, 1, 1 << 20);
    e.rank = env_rank("WEFT_RANK", 0, 0, e.world - 1);
    e.local_rank = env_rank("WEFT_LOCAL_RANK", e.rank, 0, e.world - 1);
    if (e.world > 1 && addr.empty())
      throw ConfigError(
          "WEFT_STORE_ADDR",
          "WEFT_WORLD_SIZE is set but not the store's HOST:PORT; launch with weft run");
    if (!addr.empty()) parse_addr(addr, e);
    return e;
  }
  if (!env_string("OMPI_COMM_WORLD_SIZE", "").empty()) {
    e.launcher = "mpirun";
    e.world = env_rank("OMPI_COMM_WORLD_SIZE", 1, 1, 1 << 20);
    e.rank = env_rank("OMPI_COMM_WORLD_RANK", 0, 0, e.world - 1);
    e.local_rank = env_rank("OMPI_COMM_WORLD_LOCAL_RANK", e.rank, 0, e.world - 1);
    if (!addr.empty()) {
      parse_addr(addr, e);
      return e;
    }
    // Rank 0 serves the store on this machine. The port must be the same on every rank
    // without talking: WEFT_STORE_PORT, else one derived from the job's identity.
    std::string job = env_string("PMIX_NAMESPACE", env_string("OMPI_MCA_ess_base_jobid", ""));
    int64_t port = env_int("WEFT_STORE_PORT",
                           job.empty() ? 0 : 20000 + int64_t(core::stable_hash(job) % 20000));
    if (port <= 0 || port > 65535)
      throw ConfigError(
          "WEFT_STORE_PORT",
          "under mpirun set WEFT_STORE_PORT (a free port) or WEFT_STORE_ADDR=HOST:PORT");
    e.store_port = uint16_t(port);
    e.host_store = e.rank == 0;
    return e;
  }
  return e;
}

WorkerWorld::WorkerWorld(const LaunchEnv& env, comm::Millis timeout) : env_(env) {
  if (env_.host_store) {
    comm::TCPStoreServerOptions so;
    so.host = env_.store_host;
    so.port = env_.store_port;
    so.token = comm::auth::token_from_env();
    server_ = std::make_unique<comm::TCPStoreServer>(so);
  }
  store_ = std::make_unique<comm::TCPStore>(comm::TCPStoreOptions{
      env_.store_host, env_.store_port, timeout, comm::auth::token_from_env()});
  comm::CommOptions o;
  o.rank = env_.rank;
  o.size = env_.world;
  o.store = store_.get();
  o.prefix = "train/world";
  o.timeout = timeout;
  comm_ = comm::make_communicator(comm::BackendKind::kGloo, o);
}

WorkerWorld::~WorkerWorld() {
  comm_.reset();
  store_.reset();
  // The store is only used to connect; once every rank's communicator exists nobody asks
  // it anything more, so rank 0 may stop serving while the others are still training.
  server_.reset();
}

bool agree_stop(comm::Communicator& world, bool stop) {
  core::Tensor t = core::Tensor::from_vector<int32_t>({1}, {stop ? 1 : 0});
  comm::AllReduceOptions o;
  o.op = comm::ReduceOp::kMax;
  world.all_reduce(t, o).wait();
  return t.data<int32_t>()[0] != 0;
}

}  // namespace weft::parallel
