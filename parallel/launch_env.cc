// Launch environments (weft run, mpirun, srun; torchrun refused) and the worker's world
// communicator.
#include "parallel/launch_env.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "comm/registry.h"
#include "comm/store/auth.h"
#include "comm/store/cancellable_store.h"
#include "comm/store/tcp_store.h"
#include "comm/store/tcp_store_server.h"
#include "core/rng.h"
#include "parallel/transfer_connections.h"

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

// A port in [20000, 40000) derived from the job's identity and the try's index.
uint16_t derived_port(const std::string& job, int attempt) {
  const std::string key = attempt == 0 ? job : job + "#" + std::to_string(attempt);
  return uint16_t(20000 + core::stable_hash(key) % 20000);
}

// Rank 0 serves the store on a port every rank knows without talking: WEFT_STORE_PORT, else
// one derived from the job's identity (`job`; empty when the launcher gave none), which then
// goes into e.store_job so that a taken port can be skipped (agreed_store_ports).
void agree_port(const std::string& job, const char* launcher, LaunchEnv& e) {
  e.host_store = e.rank == 0;
  if (!env_string("WEFT_STORE_PORT", "").empty() || job.empty()) {
    int64_t port = env_int("WEFT_STORE_PORT", 0);
    if (port <= 0 || port > 65535)
      throw ConfigError("WEFT_STORE_PORT", std::string("under ") + launcher +
                                               " set WEFT_STORE_PORT (a free port) or "
                                               "WEFT_STORE_ADDR=HOST:PORT");
    e.store_port = uint16_t(port);
    return;
  }
  e.store_job = job;
  e.store_port = derived_port(job, 0);
}

// torchrun (or a launcher that speaks its variables, e.g. Kubeflow's PyTorchJob) started this
// process: it serves no Weft store, so the ranks could never meet. A world of one is simply
// one process.
void refuse_torchrun() {
  // Lenient: an unrelated RANK=captain in someone's shell must not stop `weft train`.
  auto number = [](const char* v) -> int64_t {
    std::string s = env_string(v, "");
    try {
      size_t used = 0;
      long long x = std::stoll(s, &used);
      return used == s.size() ? x : -1;
    } catch (const std::exception&) {
      return -1;
    }
  };
  std::string seen;
  int64_t world = 1;  // the most processes the variables describe
  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                        "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"}) {
    if (env_string(v, "").empty()) continue;
    seen += (seen.empty() ? "" : ", ") + std::string(v);
    std::string n = v;
    if (n == "WORLD_SIZE" || n == "LOCAL_WORLD_SIZE") world = std::max(world, number(v));
    if (n == "RANK" || n == "LOCAL_RANK" || n == "GROUP_RANK") world = std::max(world, number(v) + 1);
  }
  if (world <= 1) return;
  int64_t local = number("LOCAL_WORLD_SIZE") > 0 ? number("LOCAL_WORLD_SIZE")
                  : number("WORLD_SIZE") > 0     ? number("WORLD_SIZE")
                                                 : 2;
  throw ConfigError(
      "WORLD_SIZE",
      "launched by torchrun (" + seen +
          " set) but torchrun does not start Weft's store (no WEFT_WORLD_SIZE/WEFT_STORE_ADDR "
          "from weft run), so the ranks cannot meet: launch with `weft run --standalone "
          "--nproc-per-node " + std::to_string(local) +
          " -- weft train --config ...` instead (weft run takes torchrun's flags), or with "
          "mpirun or srun");
}

}  // namespace

std::string slurm_first_host(const std::string& nodelist, const std::string& variable) {
  std::string host;
  bool in_brackets = false, took = false;  // took: this bracket group's first value is in
  for (char c : nodelist) {
    if (in_brackets) {
      if (c == ']') in_brackets = false;
      else if (c == '[') break;
      else if (c == ',' || c == '-') took = true;
      else if (!took) host += c;
      continue;
    }
    if (c == ',') break;  // the first entry of a top-level list
    if (c == ']') {
      in_brackets = true;  // unbalanced: reported below
      break;
    }
    if (c == '[') {
      in_brackets = true;
      took = false;
      continue;
    }
    host += c;
  }
  if (in_brackets || host.empty() || host.back() == '-')
    throw ConfigError(variable, "cannot read the first host of '" + nodelist +
                                    "'; expected a Slurm node list such as node[01-04] or a,b "
                                    "(or set WEFT_STORE_ADDR=HOST:PORT)");
  return host;
}

std::string address_toward(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || !found)
    return "127.0.0.1";
  std::string out = "127.0.0.1";
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in me{};
  socklen_t n = sizeof me;
  char text[INET_ADDRSTRLEN];
  if (fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &n) == 0 &&
      ::inet_ntop(AF_INET, &me.sin_addr, text, sizeof text))
    out = text;
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(found);
  return out;
}

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
    e.store_prefix = env_string("WEFT_STORE_PREFIX", "");
    e.restart_count = env_rank("TORCHELASTIC_RESTART_COUNT", 0, 0, 1 << 30);
    e.rdzv_epoch = env_rank("WEFT_RDZV_EPOCH", 0, 0, 1 << 30);
    e.nnodes = env_rank("GROUP_WORLD_SIZE", 1, 1, 1 << 20);
    const std::string range = env_string("WEFT_NNODES", "");
    if (!range.empty()) {
      const size_t colon = range.find(':');
      try {
        e.nnodes_min = std::stoi(range.substr(0, colon));
        e.nnodes_max = colon == std::string::npos ? e.nnodes_min : std::stoi(range.substr(colon + 1));
      } catch (const std::exception&) {
        throw ConfigError("WEFT_NNODES", "expected MIN:MAX as weft run sets it, got '" + range + "'");
      }
    }
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
    // Rank 0 serves the store on this machine.
    std::string job = env_string("PMIX_NAMESPACE", env_string("OMPI_MCA_ess_base_jobid", ""));
    agree_port(job, "mpirun", e);
    return e;
  }
  if (!env_string("SLURM_PROCID", "").empty()) {
    // srun: one task per process. The step's own counts first (srun inside a larger
    // allocation), then the job's.
    e.launcher = "srun";
    const char* world_var = !env_string("SLURM_STEP_NUM_TASKS", "").empty() ? "SLURM_STEP_NUM_TASKS"
                            : !env_string("SLURM_NTASKS", "").empty()        ? "SLURM_NTASKS"
                                                                             : "SLURM_NPROCS";
    e.world = env_rank(world_var, 1, 1, 1 << 20);
    e.rank = env_rank("SLURM_PROCID", 0, 0, e.world - 1);
    e.local_rank = env_rank("SLURM_LOCALID", 0, 0, e.world - 1);
    if (!addr.empty()) {
      parse_addr(addr, e);
      return e;
    }
    // Task 0 runs on the first node of the step and serves the store there.
    int64_t nodes = env_int("SLURM_STEP_NUM_NODES", env_int("SLURM_NNODES", 1));
    if (nodes > 1) {
      const char* list_var =
          !env_string("SLURM_STEP_NODELIST", "").empty() ? "SLURM_STEP_NODELIST" : "SLURM_JOB_NODELIST";
      std::string list = env_string(list_var, "");
      if (list.empty())
        throw ConfigError("SLURM_JOB_NODELIST", "srun over several nodes without a node list; "
                                                "set WEFT_STORE_ADDR=HOST:PORT of task 0's node");
      e.store_host = slurm_first_host(list, list_var);
      e.bind_host = "0.0.0.0";  // reachable from the other nodes whatever the name resolves to
    }
    std::string job = env_string("SLURM_JOB_ID", env_string("SLURM_JOBID", ""));
    if (!job.empty()) job = "slurm:" + job + "." + env_string("SLURM_STEP_ID", env_string("SLURM_STEPID", "0"));
    agree_port(job, "srun", e);
    return e;
  }
  refuse_torchrun();
  return e;
}

namespace {

// Set by rank 0 in the store it serves on a derived port, holding the job's name: how the
// other ranks tell their job's store from whatever else listens on a candidate port (another
// job's store among them).
constexpr const char* kStoreJobKey = "weft/store_job";

std::string port_list(const std::vector<uint16_t>& ports) {
  std::string s;
  for (uint16_t p : ports) s += (s.empty() ? "" : ", ") + std::to_string(p);
  return s;
}

// Rank 0's store, on the first of the agreed ports it can bind.
std::unique_ptr<comm::TCPStoreServer> serve_store(const LaunchEnv& env) {
  comm::TCPStoreServerOptions so;
  so.host = env.bind_host.empty() ? env.store_host : env.bind_host;
  so.token = comm::auth::token_from_env();
  const std::vector<uint16_t> ports = agreed_store_ports(env);
  for (size_t i = 0; i < ports.size(); ++i) {
    so.port = ports[i];
    try {
      return std::make_unique<comm::TCPStoreServer>(so);
    } catch (const comm::AddressInUseError&) {
      if (ports.size() == 1) throw;  // a port the user gave: theirs to fix
      WEFT_INFO("store", "port ", ports[i], " is taken; trying the job's next agreed port");
    }
  }
  throw comm::AddressInUseError("store: every port derived from the job '" + env.store_job +
                                "' is taken (" + port_list(ports) +
                                "); set WEFT_STORE_PORT to a free port");
}

// The other ranks' client. Where rank 0 could only have taken one port, that port; else the
// first agreed port whose store names this job, asked in turn (rank 0 may not be up yet, so
// round after round, each probe given longer so that a slow machine still answers one).
std::shared_ptr<comm::TCPStore> connect_store(const LaunchEnv& env, comm::Millis timeout) {
  const std::string token = comm::auth::token_from_env();
  const std::vector<uint16_t> ports = agreed_store_ports(env);
  if (ports.size() == 1)
    return std::make_shared<comm::TCPStore>(
        comm::TCPStoreOptions{env.store_host, ports[0], timeout, token});
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  comm::Millis probe{100};
  for (;;) {
    for (uint16_t port : ports) {
      try {
        auto s = std::make_shared<comm::TCPStore>(
            comm::TCPStoreOptions{env.store_host, port, probe, token});
        if (s->check({kStoreJobKey}) && s->get_string(kStoreJobKey) == env.store_job) {
          s->set_timeout(timeout);
          return s;
        }
      } catch (const CommError&) {
        // Nobody listens there yet, something that is not a store does, or another job's
        // store refused our token: the next port.
      }
    }
    if (std::chrono::steady_clock::now() >= deadline)
      throw TimeoutError("store: no store of job '" + env.store_job + "' on " + env.store_host +
                         " at any of its agreed ports (" + port_list(ports) + ") within " +
                         std::to_string(timeout.count()) +
                         " ms; rank 0 serves it: did it start? (or set WEFT_STORE_PORT)");
    probe = std::min(probe * 2, comm::Millis(2'000));
  }
}

}  // namespace

std::vector<uint16_t> agreed_store_ports(const LaunchEnv& env) {
  if (env.store_job.empty()) return {env.store_port};
  std::vector<uint16_t> ports;
  for (int i = 0; i < kAgreedPortTries; ++i) {
    uint16_t p = derived_port(env.store_job, i);
    if (std::find(ports.begin(), ports.end(), p) == ports.end()) ports.push_back(p);
  }
  return ports;
}

WorkerWorld::WorkerWorld(const LaunchEnv& env, comm::Millis timeout,
                         std::function<std::string()> cancelled, int connections)
    : env_(env) {
  if (env_.host_store) {
    server_ = serve_store(env_);
    env_.store_port = server_->port();
    store_ = std::make_shared<comm::TCPStore>(comm::TCPStoreOptions{
        env_.store_host, env_.store_port, timeout, comm::auth::token_from_env()});
    if (!env_.store_job.empty()) store_->set_string(kStoreJobKey, env_.store_job);
  } else {
    auto client = connect_store(env_, timeout);
    env_.store_port = client->port();
    store_ = std::move(client);
  }
  // Asked every 10 ms: an online resize whose first new epoch is replaced at once (two
  // workers lost, their agents noticing them 0.1 s apart) waited up to a whole 100 ms slice
  // to give the replaced world up.
  if (cancelled)
    store_ =
        std::make_shared<comm::CancellableStore>(store_, std::move(cancelled), comm::Millis(10));
  comm::CommOptions o;
  o.rank = env_.rank;
  o.size = env_.world;
  o.store = store_.get();
  o.prefix = env_.store_prefix.empty() ? "train/world" : env_.store_prefix + "/train/world";
  o.timeout = timeout;
  o.host = address_toward(env_.store_host, env_.store_port);
  comm_ = comm::make_communicator(comm::BackendKind::kGloo, o);
  // On one host every pair the router moves between uses shared memory: no extra connection
  // would carry a byte.
  if (connections > 1 && spans_hosts(*comm_, o.host)) more_ = connect_more(o, connections - 1);
}

std::vector<comm::Communicator*> WorkerWorld::connections() const {
  std::vector<comm::Communicator*> v;
  for (const auto& c : more_) v.push_back(c.get());
  return v;
}

WorkerWorld::~WorkerWorld() {
  more_.clear();
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
