// `weft run`'s command line: torchrun's flags (same names, same meanings, PET_<NAME>
// environment fallbacks), parsed and validated into RunOptions; and refuse_not_yet(), the
// one place that says which of them the current launcher can act on. The flag table is in
// docs/run.md.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace weft::launch {

enum class RdzvBackend { kC10d, kStatic, kEtcd, kEtcdV2 };
// --nproc-per-node: a count, or torchrun's words (auto: GPUs if any are visible, else CPUs).
enum class NprocKind { kCount, kAuto, kCpu, kGpu };

// torchrun's Std for --redirects/--tee: 0 none, 1 stdout, 2 stderr, 3 both; one value for
// every local rank, or a per-local-rank map ("0:1,1:2"; ranks not named get 0).
struct StdStreams {
  int all = 0;
  std::map<int, int> per_rank;
  bool any() const { return all != 0 || !per_rank.empty(); }
  int of(int local_rank) const;
};

// --rdzv-conf k=v,...: only known keys; durations in seconds.
struct RdzvConf {
  std::optional<double> join_timeout, last_call_timeout, close_timeout, heartbeat_interval,
      heartbeat_timeout, read_timeout, timeout;
  // How long the store an agent hosts keeps a closed connection's bound keys (the agents'
  // heartbeats): TCPStoreServerOptions::bound_key_grace, in seconds (0: drop them at once).
  // Over etcd, how long the peer check waits for a live node's closed peer connection to
  // come back before it reports the node lost (PeerCheckOptions::grace).
  std::optional<double> bound_key_grace;
  std::optional<std::string> token_file;
  std::optional<bool> insecure, is_host;
  std::vector<std::string> keys;  // the keys given, in order
};

struct RunOptions {
  int nnodes_min = 1, nnodes_max = 1;                // --nnodes N | MIN:MAX
  NprocKind nproc_kind = NprocKind::kCount;          // --nproc-per-node
  int nproc_per_node = 1;                            //   (the count when kCount)
  RdzvBackend rdzv_backend = RdzvBackend::kC10d;     // --rdzv-backend
  std::string rdzv_host;                             // --rdzv-endpoint HOST[:PORT]; "" = none
  int rdzv_port = 29400;                             //   (c10d's default port)
  std::vector<std::string> rdzv_endpoints;           //   every item, HOST:PORT (etcd: a list)
  std::string rdzv_id;                               // --rdzv-id; "" = none given
  RdzvConf rdzv_conf;                                // --rdzv-conf
  bool standalone = false;                           // --standalone
  int max_restarts = 0;                              // --max-restarts
  double monitor_interval = 0.1;                     // --monitor-interval (seconds)
  int node_rank = 0;                                 // --node-rank (static)
  std::string master_addr = "127.0.0.1";             // --master-addr (static)
  int master_port = 29500;                           // --master-port (static)
  std::string log_dir;                               // --log-dir; "" = none
  StdStreams redirects, tee;                         // -r/--redirects, -t/--tee
  std::vector<int> local_ranks_filter;               // --local-ranks-filter; empty = all
  std::string role = "default";                      // --role
  bool no_python = false;                            // --no-python (weft run's only mode)
  int store_port = 0;                                // --store-port (Weft; 0 = a free one)
  double grace = 5;                                  // --grace (Weft; seconds)
  double worker_heartbeat_interval = 1;              // --worker-heartbeat-interval (Weft; s)
  double worker_heartbeat_timeout = 5;               // --worker-heartbeat-timeout (Weft; 0 off)
  bool help = false;                                 // -h/--help
  std::vector<std::string> command;                  // after `--` or the first non-option

  // Where each flag that was set came from, by canonical name ("--nnodes"): the spelling
  // the user typed ("--nproc_per_node") or the variable ("PET_NNODES"). Errors name it.
  std::map<std::string, std::string> origin;
  bool given(const std::string& flag) const { return origin.count(flag) > 0; }
  // How a message should name `flag`: the user's spelling when given, else the flag.
  std::string name(const std::string& flag) const;
};

// Looks up an environment variable: nullopt when unset (an empty value counts as unset).
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
// The process environment.
std::optional<std::string> process_env(const std::string& name);

// Parses `weft run`'s arguments (after `run`). Every flag takes `--flag value` or
// `--flag=value`, with dashes or underscores (`--nproc_per_node`); a flag absent from the
// command line is read from PET_<NAME> (`PET_NPROC_PER_NODE`); the command line wins. The
// worker COMMAND is what follows `--`, or starts at the first argument that is not an option
// or an option's value. Validation: ConfigError naming the flag (or variable) and the fix,
// for unknown flags (with a did-you-mean), malformed numbers, MIN > MAX, conflicting flags,
// flags that do not apply to the chosen backend, and a missing COMMAND (unless --help).
// --standalone means one machine with a local store on a free port: it is refused together
// with --rdzv-endpoint, --rdzv-backend other than c10d, or --nnodes other than 1, because
// torchrun's way (silently overriding them) would leave a flag that does nothing.
RunOptions parse_run_options(const std::vector<std::string>& argv,
                             const EnvLookup& env = process_env);

// Throws ConfigError ("... not yet ...", naming the flag as given) for the first option in
// `o` that the current `weft run` cannot act on. The list of what is supported lives in
// one table in run_options.cc (kSupport); it grows as the launcher does.
void refuse_not_yet(const RunOptions& o);

// What a multi-node launch (--rdzv-endpoint without --standalone) needs besides the flags'
// own checks: --rdzv-id (ConfigError naming it), and the job token that every agent and
// worker must share: --rdzv-conf token_file, or WEFT_JOB_TOKEN or WEFT_JOB_TOKEN_FILE in
// `env` (ConfigError naming WEFT_JOB_TOKEN otherwise), unless --rdzv-conf insecure=1. A
// loopback endpoint needs the
// token too: the agents are separate processes, so a token one of them made up could not
// reach the others, and an unauthenticated loopback store is open to every local user.
void check_rendezvous_options(const RunOptions& o, const EnvLookup& env = process_env);

// The number of workers for this node: the count, or for auto/gpu/cpu the visible GPUs
// (auto: when there is at least one) else `cpus`. The caller passes
// core::cuda::device_count() (0 in a build without CUDA) and
// std::thread::hardware_concurrency(). ConfigError naming --nproc-per-node for gpu with no
// GPU visible, or no CPU count.
int resolve_nproc_per_node(const RunOptions& o, int visible_gpus, unsigned cpus);

// The port this node's agent serves the rendezvous store on: --store-port with
// --standalone (0: a free one), --master-port with static, else --rdzv-endpoint's port.
int store_port_to_serve(const RunOptions& o);

// True for localhost, 127.x.y.z, ::1, an empty host, an IPv4 address of one of this
// machine's interfaces and this machine's hostname.
bool is_local_host(const std::string& host);

// `weft run --help`.
const char* run_options_help();

}  // namespace weft::launch
