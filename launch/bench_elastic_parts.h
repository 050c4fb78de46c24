// The parts `weft bench elastic` shares between its modes (launch/bench_elastic.cc: restart,
// options and sizing; launch/bench_elastic_reshard.cc: online resharding): options, job
// sizing against this machine's memory, the agents' command line, and output-line parsing.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/config/job_spec.h"
#include "launch/args.h"
#include "launch/bench_elastic_agent.h"

namespace weft::launch::bench {

namespace fs = std::filesystem;

struct Options {
  std::string mode = "restart";  // restart | reshard | both
  std::string leaves = "apart";  // reshard, both: the two leaves one at a time, or "together"
  int nodes = 3;                 // restart: agents at the start
  std::string config;
  std::vector<std::string> sets;  // to weft train, in order
  std::vector<std::string> mode_sets;  // the mode's own settings, before the user's
  // The live side's snapshot settings, after the mode's and before the user's
  // (launch/bench_elastic_snapshots.h), and the header line that says which and why.
  std::vector<std::string> live_sets;
  std::string snapshot_header;
  int threads = 1;
  double heartbeat_timeout = 0;  // 0: weft run's default
  double timeout = 3600;
  fs::path dir;
  bool own_dir = false, keep = false;
  core::JobSpec spec;
  double params = 0;
  // What the workers of the largest world take, as size_job checked it (the estimate times
  // the measured excess): the live side's snapshots are checked beside it (choose_snapshots).
  double workers_bytes = 0;
  double memcpy_bps = 0;  // reshard, both: one thread's memcpy here, for the transfers' ratio
};

// What the restart run measured (seconds from the kill).
struct RestartResult {
  // From the kill: a survivor names the lost node; the new world is ready to step (its
  // checkpoint resumed); it logged its first step (the step itself included).
  double detect = 0, ready = 0, total = 0;
};

// "350M", "1.5B", "2.5e6" -> a count; ConfigError naming --params otherwise.
double parse_count(const std::string& s);
std::string gb(double bytes);
double param_count(const core::JobSpec& spec);
// Whether the user's --set gives `key`.
bool user_sets(const Options& o, const std::string& key);
// The bench's settings for weft train: its own, the mode's, --params' layers, the live
// side's snapshots (Options::live_sets), the user's.
std::vector<std::string> train_sets(const Options& o, int layers);
// Loads the job as the workers will, scaled to --params (or `default_params` when > 0 and
// --params is absent), and checks it can run: a global batch every world in `worlds`
// divides and memory for the largest (ConfigError with the fix otherwise).
void size_job(Options& o, const Args& a, const std::vector<int>& worlds, double default_params);
int free_port();
std::string self_exe();
double seconds_option(const Args& a, const std::string& opt, double fallback);
// The heartbeat timeout the agents use, in seconds.
double heartbeat_seconds(const Options& o);

// "... is node I of M (epoch E)" or "(rendezvous ..., epoch E)": I and E.
std::optional<std::pair<int, long long>> node_line(const std::string& s);
// The step of "[rank 0] step     3/1000000 | loss ...", or -1.
long long step_of(const std::string& s);
bool has(const std::string& s, const char* what);
void note(double t, const std::string& what);
void print_tails(const std::vector<std::unique_ptr<BenchAgent>>& agents, const fs::path& dir);
// Creates o.dir (--dir, or a temporary folder that o.own_dir marks).
void make_dir(Options& o, const Args& a);

// A line's position in one agent's output.
struct Mark {
  size_t at = 0;
  double t = 0;
};
// The first line of `a` from `from` on that `match` accepts.
std::optional<Mark> find_from(const BenchAgent& a, size_t from,
                              const std::function<bool(const std::string&)>& match);

// A checkpoint-restart after a node's loss, as the survivors' lines tell it.
struct Phases {
  std::optional<Mark> detect, rendezvous, restart, load, first_step;
  long long resumed_step = -1, first_step_no = -1;
  int new_world = 0;
  long long epoch = 0;
  bool started_over = false;  // the new rank 0 stepped without resuming
  bool complete() const { return first_step.has_value(); }
};
// The phases as far as the survivors' output has them. `from`: each survivor's line count at
// the kill. detect: the first survivor to name the change; rendezvous: the last survivor in
// the new epoch; restart, load, first step: the new rank 0's lines after its rendezvous.
Phases find_phases(const std::vector<BenchAgent*>& survivors, const std::vector<size_t>& from);

// The restart baseline (one node's agent killed after the first checkpoint), with its table;
// nullopt when it failed (said on stderr).
std::optional<RestartResult> run_restart(Options& o);
// The planned changes and a failure (launch/bench_elastic_planned.h) on a live job and, with
// `both`, first on a checkpoint-restarted one; the tables. Returns the exit code.
int run_reshard(Options& o, bool both);
// --mode spare (launch/bench_elastic_spare.cc): a member lost whole while a spare waits, on a
// checkpoint-restarted job and a live one, side by side; agents and workers run `bin`.
int run_spare_bench(Options& o, const std::string& bin);

}  // namespace weft::launch::bench
