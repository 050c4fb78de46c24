// `weft run --standalone --nproc-per-node N -- weft train ...`: parses the options, serves
// the rendezvous store and hands the workers to the supervisor (supervisor.h), which starts,
// watches and stops them. (The elastic agent comes later.)
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "base/error.h"
#include "comm/store/tcp_store_server.h"
#include "launch/args.h"
#include "launch/commands.h"
#include "launch/supervisor.h"

namespace weft::launch {
namespace {

constexpr const char* kHelp =
    R"(usage: weft run --standalone --nproc-per-node N [options] -- COMMAND [ARGS...]

  --standalone              one machine: serve the rendezvous store here (required for now)
  --nproc-per-node N        number of workers to start
  --store-port P            port of the store (default 0: a free one)
  --grace S                 seconds the workers get after SIGTERM before SIGKILL, when the
                            job stops on a failure or a signal (default 5)
  --heartbeat-interval S    seconds between a worker's heartbeats (default 1)
  --heartbeat-timeout S     a worker silent this long is hung: named, killed, job stopped
                            (default 5; 0 turns the check off)
  --log-dir DIR             keep each rank's output in DIR/attempt_0/rank_R/{stdout,stderr}.log
                            (and its error.json)
  -r, --redirects SPEC      streams that go to the files only: 0 none, 1 stdout, 2 stderr,
                            3 both; per rank as 0:1,1:2 (torchrun's meaning)
  -t, --tee SPEC            streams that go to the files and the console (same form); with
                            --log-dir and neither option, both streams of every rank are teed
  --local-ranks-filter R,.. show only these ranks' output on the console (files keep all)

Each worker runs COMMAND (a first word `weft` runs this binary) in its own process group,
with WEFT_RANK, WEFT_LOCAL_RANK, WEFT_WORLD_SIZE and WEFT_STORE_ADDR set, and torchrun's
RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_NAME,
ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID,
TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS and TORCHELASTIC_ERROR_FILE.
Output lines are prefixed with [rank r].

Workers die with weft run, however it ends (SIGKILL included), and so does whatever they
started in their process group. Ctrl-C is forwarded to every worker (weft train stops after
the step, saving a final checkpoint); SIGTERM and SIGHUP send SIGTERM; after --grace
seconds what still runs gets SIGKILL. Exit code: 130 (Ctrl-C), 143 (SIGTERM), 129 (SIGHUP).
`weft train` heartbeats to weft run; a worker that stops (SIGSTOP, a frozen process) is
named within --heartbeat-timeout. When a worker fails the others are stopped, weft run names
the root cause (the earliest failure of a rank's own, from the per-rank error files: not a
rank that merely lost its peer) and exits with that worker's code (1 when it was killed or
hung).
)";

// Seconds as a decimal number (ConfigError naming the flag otherwise).
double seconds(const Args& a, const std::string& flag, double fallback) {
  if (!a.has(flag)) return fallback;
  std::string v = a.get(flag);
  try {
    size_t used = 0;
    double x = std::stod(v, &used);
    if (used == v.size() && x >= 0 && x < 1e6) return x;
  } catch (const std::exception&) {
  }
  throw ConfigError(flag, "expected seconds (a number >= 0), got '" + v + "'");
}

std::string run_id() {
  char host[256] = "host";
  ::gethostname(host, sizeof host - 1);
  auto t = std::chrono::system_clock::now().time_since_epoch();
  return std::string(host) + "-" + std::to_string(::getpid()) + "-" +
         std::to_string(std::chrono::duration_cast<std::chrono::seconds>(t).count());
}

}  // namespace

int cmd_run(const std::vector<std::string>& argv) {
  auto sep = std::find(argv.begin(), argv.end(), std::string("--"));
  std::vector<std::string> own(argv.begin(), sep);
  if (std::find(own.begin(), own.end(), "--help") != own.end() ||
      std::find(own.begin(), own.end(), "-h") != own.end()) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  for (std::string& o : own) {  // torchrun's short forms
    if (o == "-r") o = "--redirects";
    if (o == "-t") o = "--tee";
  }
  Args a(own,
         {"--nproc-per-node", "--store-port", "--grace", "--heartbeat-interval",
          "--heartbeat-timeout", "--log-dir", "--redirects", "--tee", "--local-ranks-filter"},
         {"--standalone"});
  if (!a.flag("--standalone"))
    throw ConfigError("--standalone",
                      "only single-machine runs are supported yet; pass --standalone");
  int64_t n = a.get_int("--nproc-per-node", -1);
  if (n < 1 || n > 4096)
    throw ConfigError("--nproc-per-node", "give the number of workers, e.g. --nproc-per-node 2");
  if (sep == argv.end() || sep + 1 == argv.end())
    throw ConfigError("--", "give the worker command after --, e.g. -- weft train --config X.yaml");
  int64_t port = a.get_int("--store-port", 0);
  if (port < 0 || port > 65535)
    throw ConfigError("--store-port", "expected a port number 0..65535");

  SupervisorOptions so;
  so.nproc = int(n);
  so.command.assign(sep + 1, argv.end());
  so.grace_s = seconds(a, "--grace", 5);
  so.heartbeat_interval_s = seconds(a, "--heartbeat-interval", 1);
  so.heartbeat_timeout_s = seconds(a, "--heartbeat-timeout", 5);
  if (so.heartbeat_interval_s <= 0)
    throw ConfigError("--heartbeat-interval", "must be more than 0 seconds");
  if (so.heartbeat_timeout_s > 0 && so.heartbeat_timeout_s <= so.heartbeat_interval_s)
    throw ConfigError("--heartbeat-timeout",
                      "must exceed --heartbeat-interval (or be 0 to turn the check off)");
  so.output.log_dir = a.get_or("--log-dir", "");
  so.output.redirects = a.get_or("--redirects", "");
  so.output.tee = a.get_or("--tee", "");
  so.output.local_ranks_filter = a.get_or("--local-ranks-filter", "");
  so.run_id = run_id();

  comm::TCPStoreServerOptions server_options;
  server_options.host = "127.0.0.1";
  server_options.port = uint16_t(port);
  comm::TCPStoreServer server(server_options);
  so.store_host = "127.0.0.1";
  so.store_port = server.port();
  return supervise(so);
}

}  // namespace weft::launch
