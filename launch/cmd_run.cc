// `weft run --standalone --nproc-per-node N -- weft train ...` and, on each node,
// `weft run --nnodes N|MIN:MAX --rdzv-endpoint HOST:PORT --rdzv-id ID ...`: parses torchrun's
// options (run_options.h), refuses what it cannot do yet, and runs the job through the node
// agent (node_agent.h: membership, restarts, in-place replacement of a failed worker, the
// exit barrier). --standalone with --max-restarts is a node agent of a one-node job on
// loopback (torchrun's way): the agent replaces a failed worker in place when the workers
// reshard live and restarts every worker otherwise, as on several nodes. --standalone without
// restarts runs its one attempt here. The supervisor (supervisor.h) starts, watches and stops
// the workers.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/check.h"
#include "base/config.h"
#include "base/error.h"
#include "base/host.h"
#include "comm/store/auth.h"
#include "comm/store/tcp_store_server.h"
#include "launch/commands.h"
#include "launch/node_agent.h"
#include "launch/run_options.h"
#include "launch/snapshot_agent_launch.h"
#include "launch/supervisor.h"
#if WEFT_HAVE_CUDA
#include "core/cuda/runtime.h"
#endif

namespace weft::launch {
namespace {

std::string default_run_id() {
  auto t = std::chrono::system_clock::now().time_since_epoch();
  return host_name() + "-" + std::to_string(::getpid()) + "-" +
         std::to_string(std::chrono::duration_cast<std::chrono::seconds>(t).count());
}

int visible_gpus() {
#if WEFT_HAVE_CUDA
  return core::cuda::device_count();
#else
  return 0;
#endif
}

// --standalone without restarts: one attempt on one machine, the store in this process.
int run_standalone(const RunOptions& o, SupervisorOptions so) {
  comm::TCPStoreServerOptions server_options;
  server_options.host = "127.0.0.1";
  server_options.port = uint16_t(store_port_to_serve(o));
  // The job token: the user's WEFT_JOB_TOKEN, else a fresh one; the workers inherit it.
  const char* given = std::getenv("WEFT_JOB_TOKEN");
  server_options.token = given && *given ? given : comm::auth::generate_token();
  ::setenv("WEFT_JOB_TOKEN", server_options.token.c_str(), 1);
  comm::TCPStoreServer server(server_options);
  so.store_host = "127.0.0.1";
  so.store_port = server.port();
  if (o.given("--monitor-interval")) so.poll_s = o.monitor_interval;
  // The node's snapshot agent, when the job snapshots (snapshot.every > 0): it outlives
  // the attempts, is restarted when it dies, and ends with the job.
  std::unique_ptr<SnapshotAgentProcess> snapshots = start_snapshot_agent(so.command, so.run_id, 0);
  if (snapshots) so.monitor = [&] {
    snapshots->keep_alive();
    return std::string();
  };
  if (snapshots) snapshots->keep_alive();
  const Outcome out = supervise(so);
  if (!out.verdict.empty()) std::fprintf(stderr, "weft run: failed: %s\n", out.verdict.c_str());
  if (snapshots && out.code == 0) snapshots->finish();
  else if (snapshots) snapshots->stop();  // a failed job keeps its snapshots for a restart
  return out.code;
}

// --standalone with --max-restarts > 0: the node agent of a one-node job, its rendezvous
// store on loopback at --store-port (0: a free one), under the run's id. The agent tells
// from the workers themselves whether they reshard live (they mark the epoch notice they
// follow, epoch_notice.h): then a failed worker is replaced in place, otherwise every worker
// restarts in the next round (node_agent.h), the command being weft train or anything else.
// With no restarts left the job fails naming the worker and --max-restarts.
int run_standalone_agent(const RunOptions& o, SupervisorOptions so) {
  RunOptions a = o;
  a.standalone = false;
  a.rdzv_backend = RdzvBackend::kC10d;
  a.rdzv_host = "127.0.0.1";
  a.rdzv_port = o.store_port;
  a.rdzv_endpoints = {"127.0.0.1:" + std::to_string(o.store_port)};
  a.rdzv_id = so.run_id;
  a.nnodes_min = a.nnodes_max = 1;
  a.rdzv_conf.is_host = true;
  // The job token: the user's, else a fresh one; the workers inherit it.
  const char* given = std::getenv("WEFT_JOB_TOKEN");
  if (!(given && *given) && !std::getenv("WEFT_JOB_TOKEN_FILE"))
    ::setenv("WEFT_JOB_TOKEN", comm::auth::generate_token().c_str(), 1);
  return run_node_agent(a, std::move(so));
}

}  // namespace

int cmd_run(const std::vector<std::string>& argv) {
  RunOptions o = parse_run_options(argv);
  if (o.help) {
    std::fputs(run_options_help(), stdout);
    return 0;
  }
  refuse_not_yet(o);
  if (o.worker_heartbeat_timeout > 0 && o.worker_heartbeat_timeout <= o.worker_heartbeat_interval)
    throw ConfigError(o.name("--worker-heartbeat-timeout"),
                      "must exceed --worker-heartbeat-interval (or be 0 to turn the check off)");

  SupervisorOptions so;
  so.nproc = resolve_nproc_per_node(o, visible_gpus(), std::thread::hardware_concurrency());
  so.command = o.command;
  so.grace_s = o.grace;
  so.heartbeat_interval_s = o.worker_heartbeat_interval;
  so.heartbeat_timeout_s = o.worker_heartbeat_timeout;
  so.output.log_dir = o.log_dir;
  so.output.redirects = o.redirects;
  so.output.tee = o.tee;
  so.output.local_ranks_filter = o.local_ranks_filter;
  so.run_id = o.rdzv_id.empty() ? default_run_id() : o.rdzv_id;
  so.role = o.role;
  if (!o.standalone) return run_node_agent(o, so);
  if (o.max_restarts > 0) return run_standalone_agent(o, so);
  return run_standalone(o, so);
}

}  // namespace weft::launch
