// `weft run --standalone --nproc-per-node N -- weft train ...` and, on each of N nodes,
// `weft run --nnodes N --rdzv-endpoint HOST:PORT --rdzv-id ID ...`: parses torchrun's options
// (run_options.h), refuses what it cannot do yet, serves (or reaches) the rendezvous store,
// joins the nodes' membership (comm/elastic) and hands the workers to the supervisor
// (supervisor.h), which starts, watches and stops them. (Restarts come later.)
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
#include "comm/elastic/rendezvous.h"
#include "comm/store/auth.h"
#include "comm/store/tcp_store.h"
#include "comm/store/tcp_store_server.h"
#include "launch/commands.h"
#include "launch/run_options.h"
#include "launch/supervisor.h"
#if WEFT_HAVE_CUDA
#include "core/cuda/runtime.h"
#endif

namespace weft::launch {
namespace {

std::string default_run_id() {
  char host[256] = "host";
  ::gethostname(host, sizeof host - 1);
  auto t = std::chrono::system_clock::now().time_since_epoch();
  return std::string(host) + "-" + std::to_string(::getpid()) + "-" +
         std::to_string(std::chrono::duration_cast<std::chrono::seconds>(t).count());
}

int visible_gpus() {
#if WEFT_HAVE_CUDA
  return core::cuda::device_count();
#else
  return 0;
#endif
}

using Clock = std::chrono::steady_clock;

std::string hostname() {
  char host[256] = "host";
  ::gethostname(host, sizeof host - 1);
  return host;
}

comm::Millis millis(double s) { return comm::Millis(int64_t(s * 1000)); }

// Where this agent listens when it hosts the store: the loopback address it was given, or
// every interface for this machine's name (the other nodes must reach it).
std::string bind_host(const std::string& host) {
  if (host == "localhost" || host.empty()) return "127.0.0.1";
  if (host == "::1" || host.rfind("127.", 0) == 0) return host;
  return "0.0.0.0";
}

// Several nodes, a fixed count: host the store or reach it, join the rendezvous, supervise
// this node's workers while watching the others, and leave so that the rest can tell a
// finished node from a lost one.
int run_nodes(const RunOptions& o, SupervisorOptions so) {
  check_rendezvous_options(o);
  const std::string me = hostname() + "-" + std::to_string(::getpid());
  const bool insecure = o.rdzv_conf.insecure.value_or(false);
  const std::string token = comm::auth::token_from_env();
  const int port = store_port_to_serve(o);
  const std::string where = o.rdzv_host + ":" + std::to_string(port);

  comm::RendezvousOptions ro;
  ro.run_id = o.rdzv_id;
  ro.node_id = me;
  ro.min_nodes = ro.max_nodes = o.nnodes_max;
  const RdzvConf& c = o.rdzv_conf;
  if (c.join_timeout) ro.join_timeout = millis(*c.join_timeout);
  if (c.last_call_timeout) ro.last_call = millis(*c.last_call_timeout);
  if (c.heartbeat_interval) ro.heartbeat_interval = millis(*c.heartbeat_interval);
  if (c.heartbeat_timeout) ro.heartbeat_timeout = millis(*c.heartbeat_timeout);
  ro.poll_interval = millis(o.monitor_interval);
  comm::validate(ro);

  // torchrun's rule: on the endpoint's machine the first agent to bind the port hosts the
  // store; a taken port means another agent hosts it, so connect like everyone else.
  std::unique_ptr<comm::TCPStoreServer> server;
  if (is_local_host(o.rdzv_host)) {
    comm::TCPStoreServerOptions sso;
    sso.host = bind_host(o.rdzv_host);
    sso.port = uint16_t(port);
    sso.token = token;
    sso.insecure = insecure && token.empty();
    try {
      server = std::make_unique<comm::TCPStoreServer>(sso);
      std::fprintf(stderr, "weft run: node %s serves the rendezvous store on %s:%d\n", me.c_str(),
                   sso.host.c_str(), port);
    } catch (const comm::AddressInUseError&) {
    }
  }
  const auto t0 = Clock::now();
  comm::TCPStore store(comm::TCPStoreOptions{o.rdzv_host, uint16_t(port), ro.join_timeout, token});
  const std::string host_key = "rdzv/" + o.rdzv_id + "/store_node";
  if (server) store.set(host_key, comm::to_bytes(me));
  comm::Rendezvous rdzv(store, ro);
  const comm::Membership m = rdzv.join();
  std::string store_node = "?";
  if (store.check({host_key})) store_node = comm::to_string(store.get(host_key));
  std::fprintf(stderr,
               "weft run: node %s is node %d of %d (rendezvous %s at %s, epoch %lld) after "
               "%.2f s\n",
               me.c_str(), m.index, m.world(), o.rdzv_id.c_str(), where.c_str(), (long long)m.epoch,
               std::chrono::duration<double>(Clock::now() - t0).count());
  std::fflush(stderr);

  const std::string exited = m.store_prefix + "/exited/";
  so.node_index = m.index;
  so.nnodes = m.world();
  so.store_host = o.rdzv_host;
  so.store_port = port;
  so.store_prefix = m.store_prefix;
  so.monitor_interval_s = o.monitor_interval;
  so.settle_s = double(ro.heartbeat_timeout.count() + 2 * ro.poll_interval.count()) / 1000 + 1;
  if (!token.empty()) ::setenv("WEFT_JOB_TOKEN", token.c_str(), 1);
  // Another node's failure closes the rendezvous with its reason; a node whose heartbeat
  // key expired without its exit mark is lost (and this agent closes the job for the rest).
  so.monitor = [&]() -> std::string {
    try {
      comm::MembershipRecord r = rdzv.read_record();
      if (r.closed) return "the job was stopped by another node: " + r.close_reason;
      for (const comm::Member& x : m.members) {
        if (x.node_id == me || store.check({rdzv.alive_key(x.node_id)}) ||
            store.check({exited + x.node_id}))
          continue;
        std::string why = str("lost node ", x.node_id, " (node rank ", x.node_rank,
                              "): its heartbeat expired (none for ",
                              double(ro.heartbeat_timeout.count()) / 1000, " s)");
        rdzv.close(why);
        return why;
      }
      return "";
    } catch (const std::exception& e) {
      return str("lost the rendezvous store at ", where, " (hosted by node ", store_node,
                 ", which is gone or unreachable): ", e.what());
    }
  };
  so.on_failure = [&](const std::string& line) {
    try {
      rdzv.close(str("node ", me, ": ", line));
    } catch (const std::exception&) {
    }
  };
  int rc = supervise(so);

  // Leave: close the job for the others on any failure here (the first reason stays), mark
  // this node as exited (so its vanishing heartbeat is not a loss), stop beating.
  try {
    if (rc != 0) rdzv.close(str("node ", me, " stopped (exit code ", rc, ")"));
    store.set(exited + me, comm::to_bytes(std::to_string(rc)));
  } catch (const std::exception&) {
  }
  rdzv.heartbeat().stop_and_erase();
  if (server) {
    // The store goes with this agent: serve it until every other node has exited (or is
    // gone), so that none of them mistakes the end of the job for a lost store.
    const auto until = Clock::now() + millis(so.settle_s + o.grace + 10);
    for (const comm::Member& x : m.members)
      while (x.node_id != me && Clock::now() < until && !store.check({exited + x.node_id}) &&
             store.check({rdzv.alive_key(x.node_id)}))
        std::this_thread::sleep_for(ro.poll_interval);
  }
  return rc;
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
  if (!o.standalone) return run_nodes(o, so);

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
  return supervise(so);
}

}  // namespace weft::launch
