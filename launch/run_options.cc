// `weft run`'s command line: torchrun's flag set parsed into RunOptions, and the one table
// of what the current launcher supports (kSupport, used by refuse_not_yet).
#include "launch/run_options.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <set>

#include "base/error.h"
#include "base/host.h"
#include "base/suggest.h"

namespace weft::launch {
namespace {

enum class Arity { kValue, kFlag };

struct FlagSpec {
  const char* name;   // canonical spelling, dashes
  const char* short_name;  // "-r" or nullptr
  Arity arity;
  bool from_env;       // also read from PET_<NAME>
  const char* refuse;  // non-null: torchrun's flag that does not apply to weft run, and why
};

constexpr FlagSpec kFlags[] = {
    {"--nnodes", nullptr, Arity::kValue, true, nullptr},
    {"--nproc-per-node", nullptr, Arity::kValue, true, nullptr},
    {"--rdzv-backend", nullptr, Arity::kValue, true, nullptr},
    {"--rdzv-endpoint", nullptr, Arity::kValue, true, nullptr},
    {"--rdzv-id", nullptr, Arity::kValue, true, nullptr},
    {"--rdzv-conf", nullptr, Arity::kValue, true, nullptr},
    {"--standalone", nullptr, Arity::kFlag, true, nullptr},
    {"--max-restarts", nullptr, Arity::kValue, true, nullptr},
    {"--monitor-interval", nullptr, Arity::kValue, true, nullptr},
    {"--node-rank", nullptr, Arity::kValue, true, nullptr},
    {"--master-addr", nullptr, Arity::kValue, true, nullptr},
    {"--master-port", nullptr, Arity::kValue, true, nullptr},
    {"--log-dir", nullptr, Arity::kValue, true, nullptr},
    {"--redirects", "-r", Arity::kValue, true, nullptr},
    {"--tee", "-t", Arity::kValue, true, nullptr},
    {"--local-ranks-filter", nullptr, Arity::kValue, true, nullptr},
    {"--role", nullptr, Arity::kValue, true, nullptr},
    {"--no-python", nullptr, Arity::kFlag, true, nullptr},
    {"--store-port", nullptr, Arity::kValue, true, nullptr},
    {"--grace", nullptr, Arity::kValue, true, nullptr},
    {"--worker-heartbeat-interval", nullptr, Arity::kValue, true, nullptr},
    {"--worker-heartbeat-timeout", nullptr, Arity::kValue, true, nullptr},
    {"--help", "-h", Arity::kFlag, false, nullptr},
    // torchrun's flags that have no meaning for a launcher of arbitrary commands.
    {"--module", "-m", Arity::kFlag, true,
     "weft run starts COMMAND as given, not a Python module: write `-- python -m MODULE ...`"},
    {"--run-path", nullptr, Arity::kFlag, true,
     "weft run starts COMMAND as given: write `-- python SCRIPT.py ...`"},
    {"--start-method", nullptr, Arity::kValue, true,
     "weft run always forks and execs COMMAND; drop the flag"},
    {"--local-addr", nullptr, Arity::kValue, true,
     "not applicable to weft run yet (the store address comes from --rdzv-endpoint)"},
    {"--signals-to-handle", nullptr, Arity::kValue, true,
     "not applicable: weft run forwards SIGINT to the workers; drop the flag"},
    {"--numa-binding", nullptr, Arity::kValue, true,
     "not applicable: weft run does not bind workers to NUMA nodes; use numactl in COMMAND"},
};

const FlagSpec* find_flag(const std::string& name) {
  for (const FlagSpec& f : kFlags)
    if (name == f.name || (f.short_name && name == f.short_name)) return &f;
  return nullptr;
}

// "; did you mean X?" for the closest candidate within a few edits, else "".
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  std::optional<std::string> best = closest_match(word, candidates);
  return best ? "; did you mean " + *best + "?" : "";
}

std::string env_name(const FlagSpec& f) {
  std::string n = "PET_";
  for (const char* p = f.name + 2; *p; ++p)
    n += *p == '-' ? '_' : char(std::toupper(static_cast<unsigned char>(*p)));
  return n;
}

// "--nproc_per_node" -> "--nproc-per-node" (torchrun accepts both spellings).
std::string canonical(const std::string& typed) {
  std::string c = typed;
  for (size_t i = 2; i < c.size(); ++i)
    if (c[i] == '_') c[i] = '-';
  return c;
}

int64_t to_int(const std::string& who, const std::string& v, int64_t lo, int64_t hi,
               const std::string& hint) {
  try {
    size_t used = 0;
    long long x = std::stoll(v, &used);
    if (used == v.size() && x >= lo && x <= hi) return x;
  } catch (const std::exception&) {
  }
  throw ConfigError(who, "expected an integer in [" + std::to_string(lo) + ", " +
                             std::to_string(hi) + "], got '" + v + "'" + hint);
}

double to_seconds(const std::string& who, const std::string& v, bool allow_zero) {
  try {
    size_t used = 0;
    double x = std::stod(v, &used);
    if (used == v.size() && std::isfinite(x) && (x > 0 || (allow_zero && x == 0))) return x;
  } catch (const std::exception&) {
  }
  throw ConfigError(who, std::string("expected a number of seconds ") +
                             (allow_zero ? ">= 0" : "> 0") + ", got '" + v + "'");
}

bool to_bool(const std::string& who, const std::string& v) {
  std::string l = v;
  for (char& c : l) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (l == "1" || l == "true" || l == "yes" || l == "on") return true;
  if (l == "0" || l == "false" || l == "no" || l == "off") return false;
  throw ConfigError(who, "expected true or false (1 or 0), got '" + v + "'");
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t p = s.find(sep, start);
    out.push_back(s.substr(start, p - start));
    if (p == std::string::npos) return out;
    start = p + 1;
  }
}

void parse_nnodes(const std::string& who, const std::string& v, RunOptions& o) {
  const std::string hint = " (--nnodes N or MIN:MAX, e.g. 1:4)";
  size_t colon = v.find(':');
  if (colon == std::string::npos) {
    o.nnodes_min = o.nnodes_max = int(to_int(who, v, 1, 1 << 20, hint));
    return;
  }
  o.nnodes_min = int(to_int(who, v.substr(0, colon), 1, 1 << 20, hint));
  o.nnodes_max = int(to_int(who, v.substr(colon + 1), 1, 1 << 20, hint));
  if (o.nnodes_min > o.nnodes_max)
    throw ConfigError(who, "MIN " + std::to_string(o.nnodes_min) + " is larger than MAX " +
                               std::to_string(o.nnodes_max) + " in '" + v +
                               "'; write MIN:MAX, e.g. " + std::to_string(o.nnodes_max) + ":" +
                               std::to_string(o.nnodes_min));
}

void parse_nproc(const std::string& who, const std::string& v, RunOptions& o) {
  if (v == "auto") o.nproc_kind = NprocKind::kAuto;
  else if (v == "cpu") o.nproc_kind = NprocKind::kCpu;
  else if (v == "gpu" || v == "cuda") o.nproc_kind = NprocKind::kGpu;
  else {
    o.nproc_kind = NprocKind::kCount;
    o.nproc_per_node =
        int(to_int(who, v, 1, 4096, " (a number of workers, or auto, gpu, cpu)"));
  }
}

void parse_endpoint(const std::string& who, const std::string& v, RunOptions& o) {
  std::string host, port;
  if (!v.empty() && v[0] == '[') {  // [IPv6]:PORT
    size_t close = v.find(']');
    if (close == std::string::npos)
      throw ConfigError(who, "unclosed '[' in '" + v + "'; write [ADDR]:PORT, e.g. [::1]:29400");
    host = v.substr(1, close - 1);
    std::string rest = v.substr(close + 1);
    if (!rest.empty() && rest[0] != ':')
      throw ConfigError(who, "expected :PORT after ']' in '" + v + "'");
    if (!rest.empty()) port = rest.substr(1);
  } else {
    size_t colon = v.find(':');
    if (colon != std::string::npos && v.find(':', colon + 1) != std::string::npos)
      throw ConfigError(who, "'" + v + "' has several ':'; put an IPv6 address in brackets: [" +
                                 v + "] or [ADDR]:PORT");
    host = v.substr(0, colon);
    if (colon != std::string::npos) port = v.substr(colon + 1);
  }
  if (host.empty()) throw ConfigError(who, "no host in '" + v + "'; write HOST[:PORT]");
  o.rdzv_host = host;
  if (!port.empty() || v.back() == ':')
    o.rdzv_port = int(to_int(who, port, 0, 65535, " (the port in HOST:PORT)"));
}

void parse_conf(const std::string& who, const std::string& v, RdzvConf& c) {
  static const std::vector<std::string> kKeys = {
      "join_timeout",      "last_call_timeout", "close_timeout",  "heartbeat_interval",
      "heartbeat_timeout", "token_file",        "insecure",       "read_timeout",
      "timeout",           "is_host",           "bound_key_grace"};
  if (v.empty()) return;
  for (const std::string& item : split(v, ',')) {
    size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      throw ConfigError(who, "expected KEY=VALUE pairs separated by ',', got '" + item + "'");
    std::string key = item.substr(0, eq), val = item.substr(eq + 1);
    std::string at = who + " " + key;
    if (std::find(kKeys.begin(), kKeys.end(), key) == kKeys.end()) {
      std::string known;
      for (const std::string& k : kKeys) known += (known.empty() ? "" : ", ") + k;
      throw ConfigError(at, "unknown rendezvous setting '" + key + "'" +
                                did_you_mean(key, kKeys) + " (known: " + known + ")");
    }
    c.keys.push_back(key);
    if (key == "token_file") {
      if (val.empty()) throw ConfigError(at, "give a file path");
      c.token_file = val;
    } else if (key == "insecure") c.insecure = to_bool(at, val);
    else if (key == "is_host") c.is_host = to_bool(at, val);
    else if (key == "bound_key_grace")
      c.bound_key_grace = to_seconds(at, val, true);
    else {
      double s = to_seconds(at, val, false);
      if (key == "join_timeout") c.join_timeout = s;
      else if (key == "last_call_timeout") c.last_call_timeout = s;
      else if (key == "close_timeout") c.close_timeout = s;
      else if (key == "heartbeat_interval") c.heartbeat_interval = s;
      else if (key == "heartbeat_timeout") c.heartbeat_timeout = s;
      else if (key == "read_timeout") c.read_timeout = s;
      else c.timeout = s;
    }
  }
  if (c.heartbeat_interval && c.heartbeat_timeout && *c.heartbeat_timeout <= *c.heartbeat_interval)
    throw ConfigError(who + " heartbeat_timeout",
                      "must be longer than heartbeat_interval (a peer gets several beats "
                      "before it is declared lost), e.g. heartbeat_interval=1,heartbeat_timeout=5");
  if (c.join_timeout && c.timeout)
    throw ConfigError(who + " timeout", "is torchrun's older name of join_timeout; give one");
  if (c.insecure.value_or(false) && c.token_file)
    throw ConfigError(who + " insecure",
                      "insecure=true contradicts token_file (which secures the store); keep one");
}

void parse_std(const std::string& who, const std::string& v, StdStreams& s) {
  const std::string hint = " (0 none, 1 stdout, 2 stderr, 3 both; or LOCAL_RANK:VALUE,... e.g. 0:3,1:2)";
  s = {};
  if (v.find(':') == std::string::npos) {
    s.all = int(to_int(who, v, 0, 3, hint));
    return;
  }
  for (const std::string& item : split(v, ',')) {
    size_t colon = item.find(':');
    if (colon == std::string::npos)
      throw ConfigError(who, "expected LOCAL_RANK:VALUE, got '" + item + "'" + hint);
    int rank = int(to_int(who, item.substr(0, colon), 0, 4095, hint));
    s.per_rank[rank] = int(to_int(who, item.substr(colon + 1), 0, 3, hint));
  }
}

std::string need_value(const std::string& who, const std::string& v, const std::string& example) {
  if (v.empty()) throw ConfigError(who, "needs a value, e.g. " + example);
  return v;
}

// Converts one flag's text into `o`.
void apply(const std::string& flag, const std::string& who, const std::string& v, RunOptions& o) {
  if (flag == "--nnodes") parse_nnodes(who, v, o);
  else if (flag == "--nproc-per-node") parse_nproc(who, v, o);
  else if (flag == "--rdzv-backend") {
    if (v == "c10d") o.rdzv_backend = RdzvBackend::kC10d;
    else if (v == "static") o.rdzv_backend = RdzvBackend::kStatic;
    else if (v == "etcd") o.rdzv_backend = RdzvBackend::kEtcd;
    else if (v == "etcd-v2") o.rdzv_backend = RdzvBackend::kEtcdV2;
    else
      throw ConfigError(who, "expected c10d, static, etcd or etcd-v2, got '" + v + "'" +
                                 did_you_mean(v, {"c10d", "static", "etcd", "etcd-v2"}));
  } else if (flag == "--rdzv-endpoint") {
    // etcd takes its members as a list, "h1:2379,h2:2379,h3:2379"; each item is HOST[:PORT].
    o.rdzv_endpoints.clear();
    for (const std::string& item : split(v, ',')) {
      RunOptions one;
      parse_endpoint(who, item, one);
      o.rdzv_endpoints.push_back(item);
      if (o.rdzv_endpoints.size() == 1) {
        o.rdzv_host = one.rdzv_host;
        o.rdzv_port = one.rdzv_port;
      }
    }
  }
  else if (flag == "--rdzv-id") o.rdzv_id = need_value(who, v, "--rdzv-id job42");
  else if (flag == "--rdzv-conf") parse_conf(who, v, o.rdzv_conf);
  else if (flag == "--max-restarts") o.max_restarts = int(to_int(who, v, 0, 1 << 20, ""));
  else if (flag == "--monitor-interval") o.monitor_interval = to_seconds(who, v, false);
  else if (flag == "--node-rank") o.node_rank = int(to_int(who, v, 0, 1 << 20, ""));
  else if (flag == "--master-addr") o.master_addr = need_value(who, v, "--master-addr node01");
  else if (flag == "--master-port") o.master_port = int(to_int(who, v, 1, 65535, ""));
  else if (flag == "--log-dir") o.log_dir = need_value(who, v, "--log-dir logs");
  else if (flag == "--redirects") parse_std(who, v, o.redirects);
  else if (flag == "--tee") parse_std(who, v, o.tee);
  else if (flag == "--local-ranks-filter") {
    o.local_ranks_filter.clear();
    for (const std::string& r : split(v, ','))
      o.local_ranks_filter.push_back(int(to_int(who, r, 0, 4095, " (a comma list, e.g. 0,2)")));
  } else if (flag == "--role") o.role = need_value(who, v, "--role trainer");
  else if (flag == "--store-port") o.store_port = int(to_int(who, v, 0, 65535, ""));
  else if (flag == "--grace") o.grace = std::min(to_seconds(who, v, true), 3600.0);
  else if (flag == "--worker-heartbeat-interval") o.worker_heartbeat_interval = to_seconds(who, v, false);
  else if (flag == "--worker-heartbeat-timeout") o.worker_heartbeat_timeout = to_seconds(who, v, true);
  else if (flag == "--standalone") o.standalone = to_bool(who, v);
  else if (flag == "--no-python") o.no_python = to_bool(who, v);
  else if (flag == "--help") o.help = true;
}

// Rules between flags (each names the flag to change).
void validate(RunOptions& o) {
  const bool several = o.nnodes_max > 1;
  if (o.standalone) {
    if (o.given("--rdzv-endpoint"))
      throw ConfigError(o.name("--rdzv-endpoint"),
                        "conflicts with " + o.name("--standalone") +
                            ", which serves the store on this machine on a free port; drop one "
                            "(--store-port P picks the port of a standalone run)");
    if (o.rdzv_backend != RdzvBackend::kC10d)
      throw ConfigError(o.name("--rdzv-backend"),
                        "conflicts with " + o.name("--standalone") +
                            " (a local c10d store); drop one");
    if (several)
      throw ConfigError(o.name("--nnodes"), "--standalone is one machine; use --nnodes 1 or drop "
                                            "--standalone and give --rdzv-endpoint");
  } else if (o.given("--store-port")) {
    throw ConfigError(o.name("--store-port"),
                      "applies to --standalone; otherwise the store listens on the port of "
                      "--rdzv-endpoint HOST:PORT (or --master-port with static)");
  }
  if (o.rdzv_backend != RdzvBackend::kStatic)
    for (const char* f : {"--master-addr", "--master-port", "--node-rank"})
      if (o.given(f))
        throw ConfigError(o.name(f), std::string("applies to --rdzv-backend static only; with ") +
                                         (o.standalone ? "--standalone" : "c10d") +
                                         " the rendezvous assigns node ranks and the store is at " +
                                         (o.standalone ? "a local free port" : "--rdzv-endpoint"));
  if (o.rdzv_backend == RdzvBackend::kStatic) {
    if (o.given("--rdzv-endpoint"))
      throw ConfigError(o.name("--rdzv-endpoint"),
                        "with --rdzv-backend static the store is at --master-addr:--master-port; "
                        "give those instead");
    if (o.nnodes_min != o.nnodes_max)
      throw ConfigError(o.name("--nnodes"), "static rendezvous has a fixed number of nodes; give "
                                            "--nnodes N, or use --rdzv-backend c10d for MIN:MAX");
    if (several && !o.given("--node-rank"))
      throw ConfigError("--node-rank", "static rendezvous with --nnodes " +
                                           std::to_string(o.nnodes_max) +
                                           " needs each node's rank: --node-rank 0.." +
                                           std::to_string(o.nnodes_max - 1));
    if (several && !o.given("--master-addr"))
      throw ConfigError("--master-addr", "static rendezvous with several nodes needs the address "
                                         "of node 0: --master-addr HOST");
    if (o.node_rank >= o.nnodes_max)
      throw ConfigError(o.name("--node-rank"),
                        "must be below --nnodes " + std::to_string(o.nnodes_max) + ", got " +
                            std::to_string(o.node_rank));
  }
  if ((o.rdzv_backend == RdzvBackend::kEtcd || o.rdzv_backend == RdzvBackend::kEtcdV2) &&
      !o.given("--rdzv-endpoint"))
    throw ConfigError("--rdzv-endpoint", "--rdzv-backend etcd needs the etcd server: "
                                         "--rdzv-endpoint HOST:2379");
  if (o.rdzv_conf.is_host && o.rdzv_backend != RdzvBackend::kC10d)
    throw ConfigError(o.name("--rdzv-conf") + " is_host",
                      "chooses which agent hosts the c10d store; with static, node rank 0 "
                      "hosts it, and with etcd, node 0 of each epoch serves the workers' store: "
                      "drop it");
  if (o.rdzv_endpoints.size() > 1 && o.rdzv_backend != RdzvBackend::kEtcd)
    throw ConfigError(o.name("--rdzv-endpoint"),
                      "a list of endpoints names an etcd cluster's members; add --rdzv-backend "
                      "etcd, or give one HOST:PORT");
  if (o.rdzv_backend == RdzvBackend::kEtcd)  // etcd's client port, where none was given
    for (std::string& e : o.rdzv_endpoints)
      if (e.find(':') == std::string::npos || e.back() == ']') e += ":2379";
  if (o.rdzv_backend == RdzvBackend::kC10d && !o.standalone && several &&
      !o.given("--rdzv-endpoint"))
    throw ConfigError("--rdzv-endpoint", "several nodes need the address of the node that "
                                         "serves the store: --rdzv-endpoint HOST:PORT (the same "
                                         "on every node)");
  if (o.nproc_kind == NprocKind::kCount) {
    auto check_rank = [&](const std::string& flag, int r) {
      if (r >= o.nproc_per_node)
        throw ConfigError(o.name(flag), "local rank " + std::to_string(r) +
                                            " does not exist with --nproc-per-node " +
                                            std::to_string(o.nproc_per_node));
    };
    for (int r : o.local_ranks_filter) check_rank("--local-ranks-filter", r);
    for (const auto& [r, v] : o.redirects.per_rank) check_rank("--redirects", r);
    for (const auto& [r, v] : o.tee.per_rank) check_rank("--tee", r);
  }
  if (o.command.empty() && !o.help)
    throw ConfigError("COMMAND", "give the worker command after --, e.g. weft run "
                                 "--standalone --nproc-per-node 2 -- weft train --config X.yaml");
}

// The first --rdzv-conf key the launcher cannot act on: every key with --standalone (there
// is no rendezvous), else those that the multi-node agent does not use yet; "" when none.
std::string unsupported_conf_key(const RunOptions& o) {
  static const std::set<std::string> kUsed = {
      "join_timeout",      "last_call_timeout", "heartbeat_interval",
      "heartbeat_timeout", "insecure",          "token_file",
      "timeout",           "read_timeout",      "is_host",
      "bound_key_grace"};
  for (const std::string& k : o.rdzv_conf.keys)
    if (o.standalone || (o.rdzv_host.empty() && o.rdzv_backend != RdzvBackend::kStatic) ||
        !kUsed.count(k))
      return k;
  return "";
}

// What the current `weft run` can act on: one row per flag (or per setting of a flag). A row
// with supported=false whose `used` is true makes refuse_not_yet throw `why`. Rows marked
// supported document the table in docs/run.md; flip a row when the launcher learns it.
struct Support {
  const char* flag;
  bool supported;
  bool (*used)(const RunOptions&);
  const char* why;
};

const Support kSupport[] = {
    {"--nproc-per-node", true, [](const RunOptions&) { return true; }, ""},
    {"--standalone", true, [](const RunOptions& o) { return o.standalone; }, ""},
    {"--store-port", true, [](const RunOptions& o) { return o.given("--store-port"); }, ""},
    {"--grace", true, [](const RunOptions& o) { return o.given("--grace"); }, ""},
    {"--worker-heartbeat-interval", true,
     [](const RunOptions& o) { return o.given("--worker-heartbeat-interval"); }, ""},
    {"--worker-heartbeat-timeout", true,
     [](const RunOptions& o) { return o.given("--worker-heartbeat-timeout"); }, ""},
    {"--rdzv-id", true, [](const RunOptions& o) { return o.given("--rdzv-id"); }, ""},
    {"--log-dir", true, [](const RunOptions& o) { return o.given("--log-dir"); }, ""},
    {"--redirects", true, [](const RunOptions& o) { return o.redirects.any(); }, ""},
    {"--tee", true, [](const RunOptions& o) { return o.tee.any(); }, ""},
    {"--local-ranks-filter", true,
     [](const RunOptions& o) { return !o.local_ranks_filter.empty(); }, ""},
    {"--role", true, [](const RunOptions& o) { return o.given("--role"); }, ""},
    {"--no-python", true, [](const RunOptions& o) { return o.no_python; }, ""},
    // Several nodes: each agent joins comm/elastic's rendezvous at --rdzv-endpoint (hosting
    // the store there when the endpoint is this machine and the port is free). A fixed count
    // without restarts ends the job everywhere on a lost node or a failed worker; a range
    // MIN:MAX or --max-restarts restarts the workers (launch/node_agent.h).
    {"--nnodes", true, [](const RunOptions& o) { return o.nnodes_max > 1; }, ""},
    {"--max-restarts", true, [](const RunOptions& o) { return o.max_restarts > 0; }, ""},
    {"--rdzv-endpoint", true, [](const RunOptions& o) { return !o.rdzv_host.empty(); }, ""},
    // How often the agent looks at the rendezvous (several nodes) or its workers (standalone,
    // default 20 ms there).
    {"--monitor-interval", true, [](const RunOptions& o) { return o.given("--monitor-interval"); },
     ""},
    {"--rdzv-conf", true,
     [](const RunOptions& o) { return !o.rdzv_conf.keys.empty() && unsupported_conf_key(o).empty(); },
     ""},
    // etcd: the membership record and heartbeats live in an etcd cluster (its v3 JSON
    // gateway), which survives the loss of any one node; node 0 of each epoch serves the
    // workers' bootstrap store.
    {"--rdzv-backend", true,
     [](const RunOptions& o) { return o.rdzv_backend == RdzvBackend::kEtcd; }, ""},
    {"--rdzv-backend", false,
     [](const RunOptions& o) { return o.rdzv_backend == RdzvBackend::kEtcdV2; },
     "etcd-v2 (etcd's v2 API) is not supported; use --rdzv-backend etcd, which speaks etcd's "
     "v3 API (etcd 3.4 and later)"},
    // static: each node gives its --node-rank; node rank 0 hosts the store at
    // --master-addr:--master-port; the membership still heartbeats and restarts.
    {"--rdzv-backend", true,
     [](const RunOptions& o) { return o.rdzv_backend == RdzvBackend::kStatic; }, ""},
    {"--node-rank", true, [](const RunOptions& o) { return o.given("--node-rank"); }, ""},
    {"--master-addr", true, [](const RunOptions& o) { return o.given("--master-addr"); }, ""},
    {"--master-port", true, [](const RunOptions& o) { return o.given("--master-port"); }, ""},
    {"--standalone", false,
     [](const RunOptions& o) {
       return !o.standalone && o.rdzv_host.empty() && o.rdzv_backend != RdzvBackend::kStatic;
     },
     "or --rdzv-endpoint is needed: a rendezvous at torchrun's default endpoint is not yet "
     "supported; pass --standalone (one machine, a local store on a free port or --store-port), "
     "or --rdzv-endpoint HOST:PORT --rdzv-id ID on every node (or --rdzv-backend static with "
     "--node-rank and --master-addr)"},
    {"--rdzv-conf", false, [](const RunOptions& o) { return !unsupported_conf_key(o).empty(); },
     "this rendezvous setting is not yet supported by weft run (with --rdzv-endpoint it takes "
     "join_timeout (or timeout), last_call_timeout, heartbeat_interval, heartbeat_timeout, "
     "read_timeout, token_file, insecure, is_host and bound_key_grace; "
     "--standalone takes none); drop it"},
};

}  // namespace

int StdStreams::of(int local_rank) const {
  auto it = per_rank.find(local_rank);
  return it != per_rank.end() ? it->second : (per_rank.empty() ? all : 0);
}

std::string RunOptions::name(const std::string& flag) const {
  auto it = origin.find(flag);
  return it == origin.end() ? flag : it->second;
}

std::optional<std::string> process_env(const std::string& name) {
  const char* v = std::getenv(name.c_str());
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

RunOptions parse_run_options(const std::vector<std::string>& argv, const EnvLookup& env) {
  RunOptions o;
  // flag -> (text, who): the last occurrence on the command line wins (as with argparse).
  std::map<std::string, std::pair<std::string, std::string>> raw;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "--") {
      o.command.assign(argv.begin() + long(i) + 1, argv.end());
      break;
    }
    if (a.size() < 2 || a[0] != '-') {  // the first non-option starts COMMAND
      // ... unless a `--` follows: then this word is a stray argument, not the command.
      if (std::find(argv.begin() + long(i), argv.end(), "--") != argv.end())
        throw ConfigError(a, "unexpected argument before `--`: the worker command goes after "
                             "--, e.g. weft run --standalone --nproc-per-node 2 -- weft train "
                             "--config X.yaml");
      o.command.assign(argv.begin() + long(i), argv.end());
      break;
    }
    std::string typed = a, value;
    bool inline_value = false;
    const FlagSpec* f = nullptr;
    if (a[1] == '-') {
      if (size_t eq = a.find('='); eq != std::string::npos)
        typed = a.substr(0, eq), value = a.substr(eq + 1), inline_value = true;
      f = find_flag(canonical(typed));
    } else {  // -r 3, -r3, -h, -m
      typed = a.substr(0, 2);
      f = find_flag(typed);
      if (f && a.size() > 2) value = a.substr(a[2] == '=' ? 3 : 2), inline_value = true;
    }
    if (!f) {
      std::vector<std::string> names;
      for (const FlagSpec& s : kFlags) names.push_back(s.name);
      throw ConfigError(typed, "unknown option of weft run" + did_you_mean(canonical(typed), names) +
                                   " (see weft run --help)");
    }
    if (f->refuse) throw ConfigError(typed, f->refuse);
    if (f->arity == Arity::kFlag) {
      if (inline_value && a[1] == '-') value = value.empty() ? "1" : value;
      else if (inline_value) throw ConfigError(typed, "takes no value");
      else value = "1";
    } else if (!inline_value) {
      if (i + 1 >= argv.size()) throw ConfigError(typed, "needs a value (see weft run --help)");
      value = argv[++i];
    }
    raw[f->name] = {value, typed};
  }
  for (const FlagSpec& f : kFlags) {
    if (!f.from_env || raw.count(f.name)) continue;
    std::string var = env_name(f);
    if (auto v = env(var)) {
      if (f.refuse && (f.arity == Arity::kValue || to_bool(var, *v)))
        throw ConfigError(var, f.refuse);
      raw[f.name] = {*v, var};
    }
  }
  for (const auto& [flag, tv] : raw) {
    o.origin[flag] = tv.second;
    apply(flag, tv.second, tv.first, o);
  }
  if (!o.help) validate(o);
  return o;
}

void refuse_not_yet(const RunOptions& o) {
  for (const Support& s : kSupport) {
    if (s.supported || !s.used(o)) continue;
    std::string who = o.name(s.flag);
    if (std::string(s.flag) == "--rdzv-conf") who += " " + unsupported_conf_key(o);
    throw ConfigError(who, s.why);
  }
}

void check_rendezvous_options(const RunOptions& o, const EnvLookup& env) {
  const bool is_static = o.rdzv_backend == RdzvBackend::kStatic;
  if (o.standalone || (o.rdzv_host.empty() && !is_static)) return;
  if (o.rdzv_id.empty() && !is_static)
    throw ConfigError("--rdzv-id", "--rdzv-endpoint needs the job's id, the same on every node "
                                   "(e.g. --rdzv-id $SLURM_JOB_ID or any word): agents meet "
                                   "under it in the store");
  if (o.rdzv_conf.insecure.value_or(false) || o.rdzv_conf.token_file) return;
  if (!env("WEFT_JOB_TOKEN") && !env("WEFT_JOB_TOKEN_FILE"))
    throw ConfigError("WEFT_JOB_TOKEN",
                      "a multi-node weft run needs the job token, the same on every node, to "
                      "authenticate its store: export WEFT_JOB_TOKEN=$(openssl rand -hex 32) "
                      "(or WEFT_JOB_TOKEN_FILE=PATH, or --rdzv-conf token_file=PATH) before weft "
                      "run; on a trusted network "
                      "--rdzv-conf insecure=1 serves the store without one");
}

int resolve_nproc_per_node(const RunOptions& o, int visible_gpus, unsigned cpus) {
  switch (o.nproc_kind) {
    case NprocKind::kCount:
      return o.nproc_per_node;
    case NprocKind::kGpu:
      if (visible_gpus <= 0)
        throw ConfigError(o.name("--nproc-per-node"),
                          "gpu: no GPU is visible here; give a number of workers, or cpu");
      return visible_gpus;
    case NprocKind::kAuto:
      if (visible_gpus > 0) return visible_gpus;
      [[fallthrough]];
    case NprocKind::kCpu:
      if (cpus == 0)
        throw ConfigError(o.name("--nproc-per-node"),
                          "cannot tell how many CPUs this machine has; give a number of workers");
      return int(std::min(cpus, 4096u));
  }
  return o.nproc_per_node;
}

int store_port_to_serve(const RunOptions& o) {
  if (o.standalone) return o.store_port;
  if (o.rdzv_backend == RdzvBackend::kStatic) return o.master_port;
  return o.rdzv_port;
}

bool is_local_host(const std::string& host) {
  if (host.empty() || host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0)
    return true;
  // An IPv4 address: this machine's when one of its interfaces holds it, which is when a
  // socket can bind to it (torchrun matches the machine's addresses too).
  sockaddr_in a{};
  a.sin_family = AF_INET;
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) == 1) {
    const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    const bool local = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    if (fd >= 0) ::close(fd);
    return local;
  }
  const std::string me = host_name();
  if (me == "unknown-host") return false;
  return host == me || (me.find('.') != std::string::npos && host == me.substr(0, me.find('.')));
}

const char* run_options_help() {
  return R"(usage: weft run --standalone [options] [--] COMMAND [ARGS...]
       weft run --nnodes N --rdzv-endpoint HOST:PORT --rdzv-id ID [options] [--] COMMAND ...

torchrun's flags (also --name_with_underscores, --flag=value, and PET_<NAME> variables such as
PET_NPROC_PER_NODE; the command line wins). Marked * : parsed and checked, refused with a
"not yet" message until the launcher supports them (docs/run.md).

  --standalone                 one machine: serve the rendezvous store here on a free port
  --nproc-per-node N|auto|gpu|cpu  workers on this machine (default 1; auto: the visible GPUs,
                               else the CPU count)
  --rdzv-id ID                 the job's id (TORCHELASTIC_RUN_ID; default host-pid-time;
                               required with --rdzv-endpoint, the same on every node)
  --log-dir DIR                keep each rank's output in DIR/attempt_0/rank_R/{stdout,stderr}.log
                               (and its error.json)
  -r, --redirects 0-3|R:V,...  streams that go to the files only: 0 none, 1 stdout, 2 stderr,
                               3 both; per rank as 0:1,1:2
  -t, --tee 0-3|R:V,...        streams that go to the files and the console (same form); with
                               --log-dir and neither option, both streams of every rank are teed
  --local-ranks-filter R,...   show only these ranks' output on the console (files keep all)
  --role NAME                  ROLE_NAME of the workers (default "default")
  --no-python                  COMMAND runs as given (weft run's only mode)
  --store-port P               port of the --standalone store (default 0: a free one)
  --grace S                    seconds the workers get after SIGTERM before SIGKILL, when the
                               job stops on a failure or a signal (default 5)
  --worker-heartbeat-interval S  seconds between a worker's heartbeats to weft run (default 1)
  --worker-heartbeat-timeout S   a worker silent this long is hung: named, killed, job stopped
                               or, where a failed worker is replaced in place, replaced
                               (default 5; 0 turns the check off)
  --nnodes N|MIN:MAX           nodes (default 1); a fixed N with --rdzv-endpoint (MIN:MAX *)
  --rdzv-backend c10d|static|etcd|etcd-v2  (default c10d; static, etcd *)
  --rdzv-endpoint HOST[:PORT]  the store's address, the same on every node (default port 29400;
                               IPv6 as [ADDR]:PORT): on HOST's machine the first agent to bind
                               the port hosts the store, the others connect. Needs
                               WEFT_JOB_TOKEN (the same secret on every node; also for
                               127.0.0.1) unless --rdzv-conf insecure=1
  --rdzv-conf K=V,...          with --rdzv-endpoint: join_timeout (600), last_call_timeout (30),
                               heartbeat_interval (1), heartbeat_timeout (5: a node silent this
                               long is lost), bound_key_grace (0.25: how long the hosted
                               store keeps a closed connection's heartbeat key), insecure;
                               close_timeout, read_timeout, timeout, token_file, is_host *
  --max-restarts K           * restarts of the worker group before failing (default 0)
  --monitor-interval S         seconds between checks of the other nodes (default 0.1;
                               with --standalone *)
  --node-rank R, --master-addr H, --master-port P  * static rendezvous only

Each worker runs COMMAND (a first word `weft` runs this binary) in its own process group,
with WEFT_RANK, WEFT_LOCAL_RANK, WEFT_WORLD_SIZE and WEFT_STORE_ADDR set, and torchrun's
RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_NAME,
ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID,
TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS and TORCHELASTIC_ERROR_FILE.
Output lines are prefixed with [rank r].

On several nodes: `WEFT_JOB_TOKEN=secret weft run --nnodes 2 --nproc-per-node 4
--rdzv-endpoint node01:29400 --rdzv-id job7 -- weft train ...` on each. Worker ranks are
GROUP_RANK * P + LOCAL_RANK. A lost node (its heartbeat expired) or a failed worker on any
node stops the workers on every node; each agent names the cause (exit 1 on the others).

Workers die with weft run, however it ends (SIGKILL included), and so does whatever they
started in their process group. Ctrl-C is forwarded to every worker (weft train stops after
the step, saving a final checkpoint); SIGTERM and SIGHUP send SIGTERM; after --grace
seconds what still runs gets SIGKILL. Exit code: 130 (Ctrl-C), 143 (SIGTERM), 129 (SIGHUP).
`weft train` heartbeats to weft run; a worker that stops (SIGSTOP, a frozen process) is
named within --worker-heartbeat-timeout. When a worker fails the others are stopped, weft
run names the root cause (the earliest failure of a rank's own, from the per-rank error
files: not a rank that merely lost its peer) and exits with that worker's code (1 when it
was killed or hung).
)";
}

}  // namespace weft::launch
