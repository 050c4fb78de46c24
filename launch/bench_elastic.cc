// `weft bench elastic`: options, model sizing against this machine's memory, and the restart
// mode: the agents, the kill, the five phases and its table (launch/bench_elastic.h). The
// reshard mode is launch/bench_elastic_reshard.cc.
#include "launch/bench_elastic.h"

#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <regex>
#include <thread>

#include "base/check.h"
#include "base/error.h"
#include "comm/elastic/rendezvous_options.h"
#include "comm/store/auth.h"
#include "core/config/job_spec.h"
#include "launch/args.h"
#include "launch/bench_elastic_agent.h"
#include "launch/bench_elastic_parts.h"
#include "launch/bench_elastic_snapshots.h"
#include "planner/memory_estimate.h"
#include "planner/policy.h"

namespace weft::launch {
namespace bench {

constexpr const char* kHelp =
    "usage: weft bench elastic [--mode restart|reshard|both|spare] [--leaves apart|together]\n"
    "                          [--nodes N] [--config FILE]\n"
    "                          [--params P] [--set KEY=VALUE]... [--threads T]\n"
    "                          [--heartbeat-timeout S] [--timeout S] [--dir DIR] [--keep]\n"
    "  Agents of `weft run` on 127.0.0.1 (one node each, one worker per node) train one job\n"
    "  while nodes die and join; each change's downtime is read from the agents' output lines,\n"
    "  stamped on arrival here.\n"
    "  --mode restart  (default) the baseline: N agents (--nnodes N-1:N --max-restarts 1);\n"
    "                  right after the first checkpoint one node's agent is killed (SIGKILL, its\n"
    "                  worker dies with it). The time from the kill to the first step of the new\n"
    "                  world, split into detect (a survivor names the lost node), rendezvous\n"
    "                  (every survivor is a node of the new epoch), restart (the new rank 0's\n"
    "                  first line), load (checkpoint resumed) and first step; beside published\n"
    "                  numbers.\n"
    "  --mode reshard  the issue's planned changes and a failure on one live job\n"
    "                  (elastic.on_change: reshard, parallel.dp auto, zero 0, global_batch 12;\n"
    "                  weft run --nnodes 2:4 --max-restarts 0, 4 agents): two graceful\n"
    "                  leaves (agents SIGTERMed: their workers finish the step, hand over and\n"
    "                  exit 0; dp4 -> dp2, no bytes need to move), join (2 agents started:\n"
    "                  dp2 -> dp4), failure (an agent SIGKILLed: dp4 -> dp3). Per change: the\n"
    "                  downtime\n"
    "                  in two measures, from the notice (leave: the SIGTERM; join: the\n"
    "                  members' notice; failure: its detection, reported on its own) to the\n"
    "                  new world's first step, and no rank trains (the old world's last step\n"
    "                  -> the new world ready); the path of stamped lines from the notice; the\n"
    "                  resize line's phases (membership / communicators / plan / [read\n"
    "                  snapshots /] transfer / resume); MiB between ranks against the minimum;\n"
    "                  the workers' VmHWM.\n"
    "                  Where the failure's world (4 ranks) holds state on one rank only\n"
    "                  (from the plan's layout: ZeRO shards, tp, pp or ep without a DP\n"
    "                  replica), the live side takes in-memory snapshots: snapshot.every auto\n"
    "                  and snapshot.redundancy replica unless --set gives them (ec with\n"
    "                  k + m <= 4 too; every 0 or redundancy none is refused: the failure row\n"
    "                  would start over from step 0). The kill then waits until every node\n"
    "                  holds a peer's copy of its world's snapshot, and the failure's row says\n"
    "                  the state came from snapshots and how many steps back. dp alone at\n"
    "                  zero 0 takes none (a kill loses nothing the survivors lack).\n"
    "  --mode both     first the same job and changes under elastic.on_change: restart\n"
    "                  (--max-restarts 1, checkpoint every 2 steps, the first change after the\n"
    "                  first checkpoint): a join or a loss restarts every worker from the\n"
    "                  latest checkpoint (a join saves one at the notice); a graceful leave\n"
    "                  stops the whole job (its rendezvous is closed, as torchrun's agent\n"
    "                  closes it on a signal), and the bench relaunches the remaining nodes\n"
    "                  with --resume at once; that side's last call is 0.1 s (its best\n"
    "                  case; torchrun's default is 30 s). Then reshard, and the ratio\n"
    "                  restart / reshard per change in both measures.\n"
    "  --mode spare    a member lost whole (its agent and worker SIGKILLed) while a spare\n"
    "                  waits (--nnodes 2:3, 3 agents and a fourth beyond MAX; zero 0, dp auto,\n"
    "                  global_batch 12, 100M parameters by default), first under\n"
    "                  elastic.on_change: restart (checkpoint every 2 steps, the kill after the\n"
    "                  first), then reshard (the spare's worker, parked since the spare\n"
    "                  registered, enters as a newcomer); from the kill: detect, ready (rank 0's\n"
    "                  resize or checkpoint line), the first step of the world of 3, as a ratio\n"
    "  --weft BIN      spare: the weft binary the agents and workers run (named `weft`;\n"
    "                  default this one), to compare builds on the same bench\n"
    "  --leaves apart  (default) the two leaves one at a time: leave-a 4 -> 3, then, once that\n"
    "                  world trains, leave-b 3 -> 2\n"
    "  --leaves together  both SIGTERMs at once: leave 4 -> 2, in one epoch (the survivors\n"
    "                  wait a last call for leaves); a second leave that lands after the first's\n"
    "                  epoch formed forms another, which still lists the first leaver (departed\n"
    "                  until its hand-over is confirmed), and both hand over there\n"
    "  --nodes N       restart: agents (default 3, at least 3: 2 survivors of 3 keep a\n"
    "                  majority); reshard and both run 4\n"
    "  --config FILE   weft train's job (default configs/bench-elastic-350m.yaml: a gpt of\n"
    "                  353.84M parameters, Adam, parallel.zero 1)\n"
    "  --params P      scale the model's layers to about P parameters (350M, 40M, 2.5e8).\n"
    "                  reshard and both default to 100M: full replicas (zero 0, 16 B/parameter)\n"
    "                  on 4 ranks are 6.4 GB, 11 GB with the 1.75x measured over the estimate,\n"
    "                  which leaves a 24 GB machine room for the transitions' second copies\n"
    "                  (the 354M default would need 40 GB at zero 0 on 4 ranks)\n"
    "  --set KEY=VALUE passed to weft train (after the bench's own settings)\n"
    "  --threads T     train.threads of each worker (default: cores / ranks, at least 1)\n"
    "  --heartbeat-timeout S  the agents' --rdzv-conf heartbeat_timeout (default weft run's)\n"
    "  --timeout S     bound on each run (default 3600)\n"
    "  --dir DIR       scratch folder: checkpoints, run folder, agent-<i>.log (reshard and\n"
    "                  both: under reshard/ and restart/) (default: a\n"
    "                  temporary one, removed after a successful run unless --keep)\n"
    "  --keep          keep the temporary scratch folder\n"
    "  The job must fit this machine's memory for its largest world (estimated first; refused\n"
    "  with what to change otherwise).\n";

// --mode reshard and both: the default model (see kHelp's --params).
constexpr double kReshardDefaultParams = 100e6;

// Published numbers to set the total beside (design/anchors/elastic.md; other hardware and
// scales: framing, not like for like).
struct Reference {
  const char* what;
  double seconds;
  bool detect_only;  // compared with the detect phase rather than the total
};
const Reference kReferences[] = {
    {"DynaTrain online switch, 70B dense (< 2 s)", 2.0, false},
    {"DynaTrain online switch, 235B MoE", 4.36, false},
    {"TrainMover downtime, 1024 GPUs (~20 s)", 20.0, false},
    {"torchrun: silent node pruned, 3 x 5 s keep-alive", 15.0, true},
};

// What the job takes beyond the planner's estimate (planner/memory_estimate.h), measured:
// at 353.84M parameters, zero 1, MemAvailable fell by 19.6 GB for an estimate of 11.4 GB for
// 3 ranks (each worker at 6.5 GB resident before the kill, 7.3 GB in the world of 2 while
// resuming: the checkpoint's save and resume hold copies of the state the estimate omits).
constexpr double kMeasuredOverEstimate = 1.75;

double param_count(const core::JobSpec& spec) {
  return planner::estimate_memory(spec, 1).parameters / 4.0;  // f32
}

// "350M", "1.5B", "2.5e6" -> a count.
double parse_count(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string unit = end ? end : "";
  double k = unit.empty()                                ? 1
             : unit == "K" || unit == "k"                ? 1e3
             : unit == "M" || unit == "m"                ? 1e6
             : unit == "B" || unit == "b" || unit == "G" ? 1e9
                                                         : -1;
  if (end == s.c_str() || k < 0 || !(v > 0))
    throw ConfigError("--params", "expected a count such as 350M, 40M or 2.5e6, got '" + s + "'");
  return v * k;
}

bool user_sets(const Options& o, const std::string& key) {
  for (const std::string& s : o.sets)
    if (s.rfind(key + "=", 0) == 0) return true;
  return false;
}

std::string gb(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f GB", bytes / 1e9);
  return b;
}

// The bench's settings for weft train, then --params, then the user's --set.
std::vector<std::string> train_sets(const Options& o, int layers) {
  std::vector<std::string> s = {"checkpoint.dir=" + (o.dir / "checkpoints").string(),
                                "train.out_dir=" + (o.dir / "run").string(), "train.log_every=1",
                                "train.threads=" + std::to_string(o.threads)};
  // Every 2: the new world's first step (the one after the checkpoint it resumed) is logged
  // without a save of its own in it (weft train logs a step after its checkpoint).
  if (o.mode == "restart" && !user_sets(o, "checkpoint.every")) s.push_back("checkpoint.every=2");
  if (layers > 0) s.push_back("model.layers=" + std::to_string(layers));
  s.insert(s.end(), o.mode_sets.begin(), o.mode_sets.end());
  s.insert(s.end(), o.live_sets.begin(), o.live_sets.end());
  s.insert(s.end(), o.sets.begin(), o.sets.end());
  return s;
}

// Loads the job as the workers will, scaled to --params, and checks that it can run here:
// a global batch both worlds divide, a checkpoint, and memory for N ranks.
void size_job(Options& o, const Args& a, const std::vector<int>& worlds, double default_params) {
  o.spec = core::load_job_spec(o.config, train_sets(o, 0));
  if (a.has("--params") || (default_params > 0 && !user_sets(o, "model.layers"))) {
    // The count is affine in the layers at a fixed width and vocabulary.
    const double want = a.has("--params") ? parse_count(a.get("--params")) : default_params;
    core::JobSpec one = o.spec, two = o.spec;
    one.model.layers = 1;
    two.model.layers = 2;
    const double per_layer = param_count(two) - param_count(one);
    const double rest = param_count(one) - per_layer;
    const int layers = int(std::clamp(std::lround((want - rest) / per_layer), 1L, 4096L));
    o.spec = core::load_job_spec(o.config, train_sets(o, layers));
  }
  o.params = param_count(o.spec);
  const core::TrainSpec& t = o.spec.train;
  int64_t lcm = 1;
  std::string names;
  for (int world : worlds) {
    lcm = std::lcm(lcm, int64_t(world));
    names += (names.empty() ? "" : ", ") + std::to_string(world);
  }
  for (int world : worlds)
    if (t.global_batch % (t.micro_batch * world) != 0)
      throw ConfigError("train.global_batch",
                        str(t.global_batch, " must be a multiple of micro_batch x dp for every world (",
                            names, " ranks): use a multiple of ", t.micro_batch * lcm));
  if (o.mode == "restart" && o.spec.checkpoint.every <= 0)
    throw ConfigError("checkpoint.every",
                      "must be > 0: a node is killed after the first checkpoint");
  // Each world in the layout its workers will train (elastic.layout: auto lowers degrees that
  // do not fit it; fixed ones that do not are refused here, as the workers would).
  double need = 0;
  for (int world : worlds)
    need = std::max(need, world * planner::estimate_memory(planner::fit_layout(o.spec, world),
                                                           world).total());
  o.workers_bytes = kMeasuredOverEstimate * need;
  const int64_t avail = planner::available_memory_bytes();
  if (avail > 0 && kMeasuredOverEstimate * need > 0.9 * double(avail))
    throw ConfigError(
        "--params",
        str("the job needs about ", gb(kMeasuredOverEstimate * need), " for ",
            *std::max_element(worlds.begin(), worlds.end()), " ranks (",
            kMeasuredOverEstimate, " x the estimate of ", gb(need), "), more than 90% of the ",
            gb(double(avail)), " available: use fewer parameters (--params)",
            o.spec.parallel.zero == 0 ? ", or --set parallel.zero=1 to shard Adam's moments" : ""));
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t n = sizeof addr;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), n) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &n) != 0)
    throw IoError("weft bench elastic: cannot pick a free port on 127.0.0.1");
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string self_exe() { return fs::read_symlink("/proc/self/exe").string(); }

std::vector<std::string> agent_argv(const Options& o, int port) {
  const std::string self = self_exe();
  std::vector<std::string> v = {self, "run", "--nnodes", str(o.nodes - 1, ":", o.nodes)};
  v.insert(v.end(), {"--nproc-per-node", "1", "--max-restarts", "1"});
  v.insert(v.end(), {"--rdzv-id", "bench-elastic-" + std::to_string(::getpid())});
  v.insert(v.end(), {"--rdzv-endpoint", "127.0.0.1:" + std::to_string(port)});
  if (o.heartbeat_timeout > 0)
    v.insert(v.end(), {"--rdzv-conf", str("heartbeat_interval=", o.heartbeat_timeout / 5,
                                          ",heartbeat_timeout=", o.heartbeat_timeout)});
  v.insert(v.end(), {"--", self, "train", "--config", o.config});
  for (const std::string& s : train_sets(o, int(o.spec.model.layers)))
    v.insert(v.end(), {"--set", s});
  // The baseline is the restart path, whatever the job file says (reshard is the default).
  v.insert(v.end(), {"--set", "elastic.on_change=restart"});
  return v;
}

std::optional<Mark> find_from(const BenchAgent& a, size_t from,
                              const std::function<bool(const std::string&)>& match) {
  const auto& v = a.lines();
  for (size_t i = from; i < v.size(); ++i)
    if (match(v[i].text)) return Mark{i, v[i].t};
  return std::nullopt;
}

bool has(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

// "... is node I of M (epoch E)" (after a restart) or "(rendezvous ..., epoch E)": I and E.
std::optional<std::pair<int, long long>> node_line(const std::string& s) {
  static const std::regex re(
      R"(weft run: node \S+ is node (\d+) of \d+ \((?:rendezvous .*, )?epoch (\d+)\))");
  std::smatch m;
  if (!std::regex_search(s, m, re)) return std::nullopt;
  return std::make_pair(std::stoi(m[1]), std::stoll(m[2]));
}

// The step of "[rank 0] step     3/1000000 | loss ...", or -1.
long long step_of(const std::string& s) {
  long long step = -1;
  if (s.rfind("[rank 0] step ", 0) == 0 && has(s, "| loss"))
    std::sscanf(s.c_str() + 14, "%lld", &step);
  return step;
}

Phases find_phases(const std::vector<BenchAgent*>& survivors, const std::vector<size_t>& from) {
  Phases p;
  const BenchAgent* lead = nullptr;
  size_t lead_at = 0;
  int in_new = 0;
  for (size_t i = 0; i < survivors.size(); ++i) {
    auto d = find_from(*survivors[i], from[i],
                       [](const std::string& s) { return has(s, "weft run: membership changed"); });
    if (!d) continue;
    if (!p.detect || d->t < p.detect->t) p.detect = d;
    long long epoch = 0;
    int index = -1;
    auto r = find_from(*survivors[i], d->at, [&](const std::string& s) {
      auto n = node_line(s);
      if (n && n->second >= 2) index = n->first, epoch = n->second;
      return n && n->second >= 2;
    });
    if (!r) continue;
    ++in_new;
    p.epoch = epoch;
    if (!p.rendezvous || r->t > p.rendezvous->t) p.rendezvous = r;
    if (index == 0) lead = survivors[i], lead_at = r->at;
  }
  p.new_world = in_new;
  if (in_new < int(survivors.size()) || !lead) {
    p.rendezvous.reset();
    return p;
  }
  p.restart =
      find_from(*lead, lead_at, [](const std::string& s) { return s.rfind("[rank 0] ", 0) == 0; });
  if (!p.restart) return p;
  p.load = find_from(*lead, p.restart->at, [](const std::string& s) {
    return s.rfind("[rank 0] checkpoint: resumed from ", 0) == 0;
  });
  auto step = find_from(*lead, p.restart->at, [](const std::string& s) { return step_of(s) >= 0; });
  if (step && (!p.load || step->at < p.load->at)) {
    p.started_over = true;
    return p;
  }
  if (!p.load) return p;
  const std::string& l = lead->lines()[p.load->at].text;
  if (size_t at = l.rfind(" at step "); at != std::string::npos)
    p.resumed_step = std::atoll(l.c_str() + at + 9);
  p.first_step = step;
  if (step) p.first_step_no = step_of(lead->lines()[step->at].text);
  return p;
}

double seconds_option(const Args& a, const std::string& opt, double fallback) {
  if (!a.has(opt)) return fallback;
  char* end = nullptr;
  const std::string v = a.get(opt);
  double x = std::strtod(v.c_str(), &end);
  if (end == v.c_str() || *end || !(x > 0) || x > 1e6)
    throw ConfigError(opt, "expected seconds > 0, got '" + v + "'");
  return x;
}

void note(double t, const std::string& what) {
  std::printf("[%8.1f s] %s\n", t, what.c_str());
  std::fflush(stdout);
}

void print_tails(const std::vector<std::unique_ptr<BenchAgent>>& agents, const fs::path& dir) {
  for (size_t i = 0; i < agents.size(); ++i) {
    const auto& v = agents[i]->lines();
    std::fprintf(stderr, "--- agent %zu (pid %d), last lines of %s:\n", i, int(agents[i]->pid()),
                 (dir / ("agent-" + std::to_string(i) + ".log")).c_str());
    for (size_t k = v.size() > 12 ? v.size() - 12 : 0; k < v.size(); ++k)
      std::fprintf(stderr, "  %s\n", v[k].text.c_str());
  }
}

void print_table(const Options& o, const Phases& p, double t_kill, long long last_step) {
  const double total = p.first_step->t - t_kill;
  struct Row {
    const char* name;
    double end;
    std::string when;
  };
  const Row rows[] = {
      {"detect", p.detect->t, "a survivor's agent names the lost node (\"membership changed\")"},
      {"rendezvous", p.rendezvous->t,
       str("every survivor is a node of epoch ", p.epoch, " (", p.new_world, " nodes)")},
      {"restart", p.restart->t, "the new rank 0's first line: started, connected, model built"},
      {"load", p.load->t, str("\"checkpoint: resumed from ... at step ", p.resumed_step, "\"")},
      {"first step", p.first_step->t, str("the new world logged step ", p.first_step_no)},
  };
  std::printf("\n%-11s | %9s | %6s | %s\n", "phase", "seconds", "share", "ends when");
  double prev = t_kill;
  for (const Row& r : rows) {
    const double secs = std::max(0.0, r.end - prev);
    prev = std::max(prev, r.end);
    std::printf("%-11s | %9.3f | %5.1f%% | %s\n", r.name, secs,
                total > 0 ? 100.0 * secs / total : 0.0, r.when.c_str());
  }
  std::printf("%-11s | %9.3f | %5.1f%% | %s\n", "total", total, 100.0,
              "from the SIGKILL of the node's agent");
  std::printf(
      "the old world logged up to step %lld; the new one resumed at step %lld from the "
      "checkpoint\n",
      last_step, p.resumed_step);
  std::printf(
      "\nbaseline: restarting (elastic.on_change: restart) takes %.2f s from a node's death to the "
      "first step\nof the new world for %.2fM parameters with Adam; online resharding must beat "
      "it.\n",
      total, o.params / 1e6);
  std::printf(
      "published (design/anchors/elastic.md; other hardware and scales: framing, not like "
      "for like):\n");
  std::printf("%-50s | %9s | %s\n", "reference", "seconds", "this / it");
  const double detect = p.detect->t - t_kill;
  for (const Reference& r : kReferences)
    std::printf("%-50s | %9.2f | %8.1fx %s\n", r.what, r.seconds,
                (r.detect_only ? detect : total) / r.seconds,
                r.detect_only ? "(detect)" : "(total)");
  std::printf(
      "torchrun publishes no restart time: it restarts every worker and reloads the checkpoint "
      "as here,\nand sees a vanished node by keep-alive pruning (the last row) or NCCL "
      "timeouts (10-30 min).\n");
}


double heartbeat_seconds(const Options& o) {
  return o.heartbeat_timeout > 0
             ? o.heartbeat_timeout
             : double(comm::RendezvousOptions{}.heartbeat_timeout.count()) / 1000;
}

void make_dir(Options& o, const Args& a) {
  if (a.has("--dir")) {
    o.dir = a.get("--dir");
    fs::create_directories(o.dir);
  } else {
    std::string t = (fs::temp_directory_path() / "weft_bench_elastic_XXXXXX").string();
    if (!::mkdtemp(t.data())) throw IoError("weft bench elastic: cannot create " + t);
    o.dir = t;
    o.own_dir = true;
  }
}

std::optional<RestartResult> run_restart(Options& o) {
  const core::JobSpec& s = o.spec;
  const planner::MemoryEstimate per_rank = planner::estimate_memory(s, o.nodes);
  const double hb = heartbeat_seconds(o);
  std::printf(
      "weft bench elastic --mode restart: from a node's death to the first step of the new "
      "world\n");
  std::printf(
      "  %d nodes x 1 worker on 127.0.0.1: weft run --nnodes %d:%d --max-restarts 1, "
      "heartbeat_timeout %g s\n",
      o.nodes, o.nodes - 1, o.nodes, hb);
  std::printf(
      "  model: %s %lld x %lld, vocab %lld, seq %lld: %.2fM parameters, f32, Adam, "
      "parallel.zero %lld, train.threads %d (%d cores)\n",
      s.model.arch.c_str(), (long long)s.model.layers, (long long)s.model.dim,
      (long long)s.model.vocab, (long long)s.model.seq_len, o.params / 1e6,
      (long long)s.parallel.zero, o.threads, int(std::max(1u, std::thread::hardware_concurrency())));
  std::printf(
      "  state: 16 B/parameter = %s per full replica; estimated %s per rank, %s for %d ranks "
      "(%s available)\n",
      gb(16 * o.params).c_str(), gb(per_rank.total()).c_str(),
      gb(o.nodes * per_rank.total()).c_str(), o.nodes,
      gb(double(planner::available_memory_bytes())).c_str());
  std::printf("  checkpoint every %lld steps into %s; a node is killed after the first\n",
              (long long)s.checkpoint.every, (o.dir / "checkpoints").c_str());
  std::fflush(stdout);

  const std::string token = comm::auth::generate_token();
  ::setenv("WEFT_JOB_TOKEN", token.c_str(), 1);
  const std::vector<std::string> argv_agent = agent_argv(o, free_port());
  const auto origin = BenchAgent::Clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(BenchAgent::Clock::now() - origin).count();
  };
  std::vector<std::unique_ptr<BenchAgent>> agents;
  for (int i = 0; i < o.nodes; ++i)
    agents.push_back(std::make_unique<BenchAgent>(
        argv_agent, (o.dir / ("agent-" + std::to_string(i) + ".log")).string(), origin));
  note(elapsed(), str("started ", o.nodes, " agents"));

  std::vector<int> index(size_t(o.nodes), -1);
  std::vector<size_t> scanned(size_t(o.nodes), 0), kill_at;
  int host = -1, victim = -1;
  long long last_step = -1, saved_step = -1;
  double t_kill = 0;
  const int64_t avail_before = planner::available_memory_bytes();
  int64_t low_avail = avail_before;  // the job's peak, as this machine saw it
  bool said_joined = false;
  Phases ph;
  std::string failure;
  for (;;) {
    pump_agents(agents, 50);
    const double now = elapsed();
    low_avail = std::min(low_avail, planner::available_memory_bytes());
    for (int i = 0; i < o.nodes && failure.empty(); ++i)
      if (i != victim && !agents[size_t(i)]->running())
        failure = str("agent ", i, " (pid ", agents[size_t(i)]->pid(), ") exited with code ",
                      agents[size_t(i)]->exit_code(), " before the new world's first step");
    if (failure.empty() && now > o.timeout)
      failure = str("no ",
                    victim < 0       ? "checkpoint"
                    : !ph.detect     ? "detection"
                    : !ph.rendezvous ? "new world"
                    : !ph.restart    ? "worker"
                    : !ph.load       ? "resume"
                                     : "step",
                    " within --timeout ", o.timeout, " s");
    if (!failure.empty()) break;
    if (victim < 0) {  // the first world: who is who, then the first checkpoint
      for (int i = 0; i < o.nodes; ++i) {
        const auto& v = agents[size_t(i)]->lines();
        for (size_t& k = scanned[size_t(i)]; k < v.size(); ++k) {
          const std::string& l = v[k].text;
          if (auto n = node_line(l)) index[size_t(i)] = n->first;
          if (has(l, "serves the rendezvous store")) host = i;
          if (l.rfind("[rank 0] checkpoint: step ", 0) == 0 && has(l, " saved to "))
            saved_step = std::atoll(l.c_str() + 26);
        }
      }
      if (!said_joined && std::count(index.begin(), index.end(), -1) == 0) {
        said_joined = true;
        note(now, str("the ", o.nodes, " agents formed epoch 1; agent ", host, " hosts the store"));
      }
      if (saved_step < 0) continue;
      for (int i = 0; i < o.nodes; ++i)  // the last node that neither hosts the store nor leads
        if (i != host && index[size_t(i)] > 0 &&
            (victim < 0 || index[size_t(i)] > index[size_t(victim)]))
          victim = i;
      if (victim < 0) {
        failure = "no node to kill: every node hosts the store or leads";
        break;
      }
      kill_at.clear();
      for (int i = 0; i < o.nodes; ++i)
        if (i != victim) kill_at.push_back(agents[size_t(i)]->lines().size());
      t_kill = elapsed();
      agents[size_t(victim)]->kill();
      note(t_kill,
           str("checkpoint saved at step ", saved_step, "; killed node ", index[size_t(victim)],
               " (agent ", victim, ", pid ", agents[size_t(victim)]->pid(), ") with SIGKILL"));
      continue;
    }
    std::vector<BenchAgent*> survivors;
    for (int i = 0; i < o.nodes; ++i)
      if (i != victim) survivors.push_back(agents[size_t(i)].get());
    ph = find_phases(survivors, kill_at);
    if (ph.started_over) failure = "the new world started over from step 0: no checkpoint resumed";
    if (ph.complete() || !failure.empty()) break;
  }
  if (!failure.empty()) {
    std::fprintf(stderr, "weft bench elastic: failed: %s\n", failure.c_str());
    print_tails(agents, o.dir);
    std::fprintf(stderr, "logs and checkpoints kept in %s\n", o.dir.c_str());
    return std::nullopt;
  }
  note(ph.first_step->t, str("the new world logged its first step; stopping the agents"));
  // The old world's last step: rank 0's progress lines until its agent named the change (the
  // old lead survives: the victim is never node 0).
  for (int i = 0; i < o.nodes; ++i)
    if (index[size_t(i)] == 0)
      for (const StampedLine& l : agents[size_t(i)]->lines()) {
        if (has(l.text, "weft run: membership changed")) break;
        if (long long st = step_of(l.text); st >= 0) last_step = st;
      }
  agents.clear();  // SIGKILL and reap: their workers die with them
  if (avail_before > 0 && low_avail >= 0)
    std::printf(
        "  memory: MemAvailable fell by %s at most while the job ran (this machine, "
        "other processes included; estimated %s)\n",
        gb(double(avail_before - low_avail)).c_str(),
        gb(o.nodes * planner::estimate_memory(o.spec, o.nodes).total()).c_str());
  print_table(o, ph, t_kill, last_step);
  if (o.own_dir && !o.keep) {
    std::error_code ec;
    fs::remove_all(o.dir, ec);
  } else {
    std::printf("logs (agent-<i>.log, lines stamped in seconds) and checkpoints kept in %s\n",
                o.dir.c_str());
  }
  return RestartResult{ph.detect->t - t_kill, ph.load->t - t_kill, ph.first_step->t - t_kill};
}

}  // namespace bench

int run_elastic_bench(const std::vector<std::string>& argv) {
  using namespace bench;
  for (const std::string& s : argv)
    if (s == "--help" || s == "-h") return std::fputs(kHelp, stdout), 0;
  Args a(argv,
         {"--mode", "--nodes", "--config", "--params", "--set", "--threads", "--heartbeat-timeout",
          "--timeout", "--dir", "--leaves", "--weft"},
         {"--keep"});
  Options o;
  o.mode = a.get_or("--mode", "restart");
  if (o.mode != "restart" && o.mode != "reshard" && o.mode != "both" && o.mode != "spare")
    throw ConfigError("--mode", "'" + o.mode + "': expected restart, reshard, both or spare");
  if (a.has("--weft") && o.mode != "spare")
    throw ConfigError("--weft", "only --mode spare runs another build; leave it out");
  o.leaves = a.get_or("--leaves", "apart");
  if (o.leaves != "apart" && o.leaves != "together")
    throw ConfigError("--leaves", "'" + o.leaves + "': expected apart or together");
  if ((o.mode == "restart" || o.mode == "spare") && a.has("--leaves"))
    throw ConfigError("--leaves", "only --mode reshard and both have leaves; leave it out");
  o.nodes = int(a.get_int("--nodes", 3));
  if (o.mode == "restart" && (o.nodes < 3 || o.nodes > 16))
    throw ConfigError("--nodes", str(o.nodes,
                                     ": expected 3 to 16; the survivors of a loss must "
                                     "be a strict majority of the last membership (2 of 3)"));
  if (o.mode != "restart" && a.has("--nodes") && o.nodes != 4)
    throw ConfigError("--nodes", str(o.nodes, ": --mode ", o.mode,
                                     " runs 4 nodes (dp4 -> dp2 -> dp4 -> dp3); leave --nodes out"));
  o.config =
      a.get_or("--config", std::string(WEFT_SOURCE_DIR) + "/configs/bench-elastic-350m.yaml");
  o.sets = a.all("--set");
  o.heartbeat_timeout = seconds_option(a, "--heartbeat-timeout", 0);
  o.timeout = seconds_option(a, "--timeout", 3600);
  o.keep = a.flag("--keep");
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  // The same job for both modes: full replicas (zero 0: a DP shrink moves no bytes, and
  // the dead ranks' moments live on in the survivors) and a batch dp 4, 3 and 2 divide.
  if (o.mode != "restart")
    o.mode_sets = {"parallel.zero=0", "parallel.dp=auto", "train.global_batch=12"};
  const int most = o.mode == "restart" ? o.nodes : 4;  // spare: 3 members and the spare
  o.threads = int(a.get_int("--threads", std::max(1, cores / most)));
  if (o.threads < 1) throw ConfigError("--threads", "expected at least 1");
  // Before the scratch folder exists: a refusal leaves nothing behind.
  if (o.mode == "restart") {
    size_job(o, a, {o.nodes, o.nodes - 1}, 0);
    make_dir(o, a);
    return run_restart(o) ? 0 : 1;
  }
  if (o.mode == "spare") {
    const std::string bin = a.get_or("--weft", self_exe());
    if (fs::path(bin).filename() != "weft" || !fs::exists(bin))
      throw ConfigError("--weft", "'" + bin +
                                      "': expected an existing binary named weft (weft "
                                      "run starts a command whose first word is weft as itself)");
    size_job(o, a, {3, 2}, kReshardDefaultParams);
    make_dir(o, a);
    return run_spare_bench(o, fs::absolute(bin).string());
  }
  size_job(o, a, {4, 3, 2}, kReshardDefaultParams);
  choose_snapshots(o);
  make_dir(o, a);
  return run_reshard(o, o.mode == "both");
}

}  // namespace weft::launch
