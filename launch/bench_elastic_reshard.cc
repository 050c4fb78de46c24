// `weft bench elastic --mode reshard|both`: one four-node job per side through the issue's
// planned changes and a failure (launch/bench_elastic_planned.h): two agents SIGTERMed (a
// graceful leave, 4 -> 2: one after the other, or with --leaves together at once), two agents
// started (a join, 2 -> 4), one agent SIGKILLed (4 -> 3).
// The live side (elastic.on_change: reshard) keeps its processes; the restart side does what
// a user of on_change: restart gets: a join or a loss restarts every worker from the latest
// checkpoint (a join saves one at the notice), and a graceful leave stops the whole job (the
// rendezvous is closed, as torchrun's agent closes it on a signal), so the bench relaunches
// the remaining nodes with --resume at once, as a scheduler would.
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>

#include "base/check.h"
#include "base/error.h"
#include "base/proc.h"
#include "comm/store/auth.h"
#include "launch/bench_elastic.h"
#include "launch/bench_elastic_planned.h"
#include "launch/bench_snapshot_parts.h"
#include "launch/bench_util.h"
#include "planner/memory_estimate.h"

namespace weft::launch::bench {
namespace {

std::string slurp_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// VmHWM of `pid` in GiB, or -1.
double hwm_gib(pid_t pid) {
  std::istringstream in(slurp_file(fs::path("/proc") / std::to_string(pid) / "status"));
  for (std::string l; std::getline(in, l);)
    if (l.rfind("VmHWM:", 0) == 0) return std::atof(l.c_str() + 6) / (1024.0 * 1024.0);
  return -1;
}

// One run id per side (the checkpoints' and the snapshots' job id derive from it).
std::string rdzv_id(bool live) { return str("bench-", live ? "reshard-" : "restart-", ::getpid()); }

// `resume`: the restart side's relaunch after a graceful leave stopped the job (a fresh
// `weft run`, so its workers are told where the checkpoints are, as a user would).
std::vector<std::string> side_argv(const Options& o, bool live, int port, bool resume) {
  const std::string self = self_exe();
  const double hb = heartbeat_seconds(o);
  std::vector<std::string> v = {self, "run", "--nnodes", "2:4", "--nproc-per-node", "1",
                                "--max-restarts", live ? "0" : "1"};
  // One run id per side (the checkpoints' job id derives from it: the relaunch resumes them).
  v.insert(v.end(), {"--rdzv-id", rdzv_id(live)});
  v.insert(v.end(), {"--rdzv-endpoint", "127.0.0.1:" + std::to_string(port)});
  // The restart side's last call 0.1 s, not torchrun's 30 s: a relaunch after a leave forms
  // with the nodes that came at once (its best case; a join of two fills the job at once).
  v.insert(v.end(), {"--rdzv-conf", str("heartbeat_interval=", hb / 5, ",heartbeat_timeout=", hb,
                                        live ? "" : ",last_call_timeout=0.1")});
  v.insert(v.end(), {"--", self, "train", "--config", o.config});
  if (resume) v.insert(v.end(), {"--resume", (o.dir / "checkpoints").string()});
  for (const std::string& s : train_sets(o, int(o.spec.model.layers))) v.insert(v.end(), {"--set", s});
  v.insert(v.end(), {"--set", live ? "elastic.on_change=reshard" : "elastic.on_change=restart"});
  // The restart side is the checkpoint baseline: no snapshots, whatever --set says.
  if (!live) v.insert(v.end(), {"--set", "snapshot.every=0"});
  return v;
}

struct Found {
  int agent = -1;
  size_t at = 0;
  StampedLine line;
};

class Run {
 public:
  Run(Options& o, bool live)
      : o_(o), live_(live), origin_(BenchAgent::Clock::now()), rdzv_id_(rdzv_id(live)) {
    argv_ = side_argv(o, live, free_port(), false);
  }

  double now() const {
    return std::chrono::duration<double>(BenchAgent::Clock::now() - origin_).count();
  }
  int start() {
    agents_.push_back(std::make_unique<BenchAgent>(
        argv_, (o_.dir / ("agent-" + std::to_string(agents_.size()) + ".log")).string(), origin_));
    index_.push_back(-1);
    return int(agents_.size()) - 1;
  }
  // The restart side after a graceful leave: a new `weft run` (a new store) resuming the
  // checkpoints.
  void relaunch_argv() { argv_ = side_argv(o_, live_, free_port(), true); }
  std::vector<size_t> marks() const {
    std::vector<size_t> m;
    for (const auto& a : agents_) m.push_back(a->lines().size());
    return m;
  }
  // The first line after `from` (agents started since: from their start) that `match`
  // accepts, in agent order; nullopt when none yet.
  std::optional<Found> find(const std::vector<size_t>& from,
                            const std::function<bool(int, const std::string&)>& match) {
    std::optional<Found> best;
    for (size_t i = 0; i < agents_.size(); ++i) {
      const auto& v = agents_[i]->lines();
      for (size_t k = i < from.size() ? from[i] : 0; k < v.size(); ++k) {
        if (auto n = node_line(v[k].text)) index_[i] = n->first;
        std::smatch m;  // a live agent's new place: "...; node X is node I of M, its workers"
        static const std::regex live(R"(is node (\d+) of \d+, its workers reshard live)");
        if (std::regex_search(v[k].text, m, live)) index_[i] = std::stoi(m[1]);
        if (match(int(i), v[k].text)) {
          if (!best || v[k].t < best->line.t) best = Found{int(i), k, v[k]};
          break;
        }
      }
    }
    return best;
  }
  // Pumps until find() finds a line. Throws Error when an agent not in gone_ ended, or at
  // --timeout.
  Found wait_line(const std::vector<size_t>& from, const std::string& what,
                  const std::function<bool(int, const std::string&)>& match) {
    for (;;) {
      if (auto f = find(from, match)) return *f;
      check_running(what);
      pump_agents(agents_, 50);
    }
  }
  void check_running(const std::string& what) {
    for (size_t i = 0; i < agents_.size(); ++i)
      if (!agents_[i]->running() && !gone_.count(int(i)))
        throw Error(str("agent ", i, " (pid ", agents_[i]->pid(), ") exited with code ",
                        agents_[i]->exit_code(), " while waiting for ", what));
    if (now() > o_.timeout) throw Error(str("no ", what, " within --timeout ", o_.timeout, " s"));
  }
  // Until every agent has ended (the restart side's stopped job); the stamp when it had.
  double wait_all_ended(const std::string& what) {
    for (;;) {
      pump_agents(agents_, 50);
      bool any = false;
      for (const auto& a : agents_) any = any || a->running();
      if (!any) return now();
      if (now() > o_.timeout) throw Error(str("no ", what, " within --timeout ", o_.timeout, " s"));
    }
  }
  // Agents in this epoch, by node index, that neither host the store nor lead: the last ones.
  std::vector<int> victims(int n) const {
    std::vector<int> v;
    for (size_t i = 0; i < agents_.size(); ++i)
      if (agents_[i]->running() && !gone_.count(int(i)) && int(i) != host_ && index_[i] > 0)
        v.push_back(int(i));
    std::sort(v.begin(), v.end(), [&](int a, int b) { return index_[size_t(a)] > index_[size_t(b)]; });
    if (int(v.size()) < n) throw Error(str("fewer than ", n, " nodes to stop"));
    v.resize(size_t(n));
    return v;
  }
  // The latest rank-0 step line of any agent stamped before `t` (the old world's last step).
  std::pair<double, long long> last_step_before(double t) const {
    std::pair<double, long long> best{0, -1};
    for (const auto& a : agents_)
      for (const StampedLine& l : a->lines())
        if (l.t < t && l.t >= best.first)
          if (long long s = step_of(l.text); s >= 0) best = {l.t, s};
    return best;
  }
  // Until rank 0 has logged `n` steps after `from` (find() looks again from `from` each time,
  // so the steps are counted by number, not by calls).
  void wait_steps(const std::vector<size_t>& from, size_t n, const std::string& what) {
    std::set<long long> seen;
    wait_line(from, what, [&](int, const std::string& l) {
      if (long long st = step_of(l); st >= 0) seen.insert(st);
      return seen.size() >= n;
    });
  }
  // Waits for the store's host and three steps of the first world.
  void warm_up(const std::vector<size_t>& from) {
    wait_line(from, "the store's host", [&](int i, const std::string& l) {
      if (has(l, "serves the rendezvous store")) host_ = i;
      return host_ >= 0;
    });
    wait_steps(from, 3, "three steps of the first world");
    // The restart side needs a checkpoint to resume (the baseline's rule: the change comes
    // right after the first, the restart's best case).
    if (!live_)
      wait_line(from, "the first checkpoint", [](int, const std::string& l) {
        return l.rfind("[rank 0] checkpoint: step ", 0) == 0 && has(l, " saved to ");
      });
  }

  Options& o_;
  bool live_;
  BenchAgent::Clock::time_point origin_;
  std::vector<std::string> argv_;
  std::vector<std::unique_ptr<BenchAgent>> agents_;
  std::vector<int> index_;
  std::map<int, bool> gone_;  // agents that are meant to end
  int host_ = -1;
  std::string rdzv_id_;
};

void parse_resize(Change& c, const std::string& s) {
  static const std::regex router(
      R"(state from (\d+) holders? through the router \(([\d.e+-]+) MiB between ranks; rank 0 kept ([\d.e+-]+) MiB in place and copied ([\d.e+-]+) MiB)");
  // Nobody alive held the whole state (launch/train_ranks.cc, print_arrival).
  static const std::regex snapshots(
      R"(resumed at step (\d+) \((\d+) steps back\) from (\d+) holders, \d+ of them in-memory snapshots \(([^)]*)\), through the router \(([\d.e+-]+) MiB between ranks)");
  static const std::regex checkpoint(R"(resumed from the latest checkpoint at step (\d+), (\d+) steps back)");
  static const std::regex over(R"(started over from step 0, (\d+) steps back)");
  static const std::regex again(
      R"(training again ([\d.]+) s after the change \(membership ([\d.]+), communicators ([\d.]+), plan ([\d.]+), read snapshots ([\d.]+), transfer ([\d.]+), resume ([\d.]+)\))");
  std::smatch m;
  if (std::regex_search(s, m, router)) {
    c.holders = std::stoi(m[1]);
    c.mib_between = std::stod(m[2]);
    c.mib_kept = std::stod(m[3]);
    c.mib_copied = std::stod(m[4]);
  } else if (std::regex_search(s, m, snapshots)) {
    c.source = "snapshots";
    c.resumed_step = std::stoll(m[1]);
    c.went_back = std::stoll(m[2]);
    c.holders = std::stoi(m[3]);
    c.origins = m[4];
    c.mib_between = std::stod(m[5]);
  } else if (std::regex_search(s, m, checkpoint)) {
    c.source = "checkpoint";
    c.resumed_step = std::stoll(m[1]);
    c.went_back = std::stoll(m[2]);
  } else if (std::regex_search(s, m, over)) {
    throw Error(str("the world of ", c.to, " started over from step 0 (", m[1],
                    " steps back): nobody alive held the lost state, and no snapshot or "
                    "checkpoint did: ", s));
  } else {
    throw Error("the resize line does not say where its state came from: " + s);
  }
  static const std::regex waited(R"(of the transfer, ([\d.]+) s until the last rank reached the move)");
  if (std::regex_search(s, m, waited)) c.transfer_wait = std::stod(m[1]);
  if (!std::regex_search(s, m, again)) throw Error("no phases in the resize line: " + s);
  c.again = std::stod(m[1]);
  c.membership = std::stod(m[2]);
  c.communicators = std::stod(m[3]);
  c.plan = std::stod(m[4]);
  c.read = std::stod(m[5]);
  c.transfer = std::stod(m[6]);
  c.resume = std::stod(m[7]);
  c.comms_ahead = has(s, "its communicator was connected while the old world ended its step");
  static const std::regex epochs(R"(resize: epoch (\d+) -> (\d+),)");
  if (std::regex_search(s, m, epochs)) {
    c.epochs = int(std::stoll(m[2]) - std::stoll(m[1]));
    c.epoch = std::stoll(m[2]);
  }
}

// The new world of `c` ready and stepping: fills ready, first, last_step and (live) the
// resize line's numbers; then waits for two more steps, so the next change finds it training.
void finish_change(Run& run, Change& c, const std::vector<size_t>& from) {
  Found ready;
  if (run.live_) {
    const std::string want = str("world ", c.from, " -> ", c.to, " (");
    ready = run.wait_line(from, "resize line (" + want + ")", [&](int, const std::string& s) {
      return s.rfind("[rank 0] resize: ", 0) == 0 && has(s, want.c_str());
    });
    parse_resize(c, ready.line.text);
  } else {
    // Only a world of the change's size: a join's joiners may come in one epoch or two.
    auto started = run.wait_line(from, "the new world's rank 0", [&](int, const std::string& s) {
      return s.rfind("[rank 0] weft train: ", 0) == 0 && has(s, str(" world ", c.to, " =").c_str());
    });
    c.path.push_back({"new rank 0 built", started.line.t});
    // The resume comes before the banner: the last one of that agent since `from`.
    const auto& lines = run.agents_[size_t(started.agent)]->lines();
    bool got = false;
    const size_t a = size_t(started.agent), since = a < from.size() ? from[a] : 0;
    for (size_t k = started.at; !got && k-- > since;)
      if (lines[k].text.rfind("[rank 0] checkpoint: resumed from ", 0) == 0)
        ready = Found{started.agent, k, lines[k]}, got = true;
    if (!got) throw Error(str("the world of ", c.to, " started without resuming a checkpoint"));
    if (size_t at = ready.line.text.rfind(" at step "); at != std::string::npos)
      c.resumed_step = std::atoll(ready.line.text.c_str() + at + 9);
  }
  c.ready = ready.line.t;
  c.path.push_back({run.live_ ? "resize line" : "checkpoint resumed", c.ready});
  std::vector<size_t> after = run.marks();
  after[size_t(ready.agent)] = ready.at;
  auto first = run.wait_line(after, "first step of the new world", [&](int i, const std::string& s) {
    if (i != ready.agent || step_of(s) < 0) return false;
    return !run.live_ || has(s, str(" world ", c.to, " after a resize of ").c_str());
  });
  c.first = first.line.t;
  std::tie(c.last_step, c.last_step_no) = run.last_step_before(c.ready);
  c.path.push_back({"first step", c.first});
  if (run.live_)
    for (size_t i = 0; i < run.agents_.size(); ++i)
      if (run.agents_[i]->running())
        if (pid_t w = worker_child(run.agents_[i]->pid()); w > 0) c.hwm_gib.push_back(hwm_gib(w));
  note(c.first, str(run.live_ ? "reshard" : "restart", " ", c.name, ": the world of ", c.to,
                    " logged its first step, ", fixed3(c.from_notice()), " s after the notice"));
  run.wait_steps(run.marks(), 2, "two steps of the new world");
}

// The ms of a step line ("... | mem 12.0 MiB | 1234 ms" or "... | 1234 ms | world 3 after a
// resize of 0.1 s"), or -1.
double step_ms(const std::string& l) {
  static const std::regex ms(R"(\| ([\d.]+) ms(?: \||$))");
  std::smatch m;
  return std::regex_search(l, m, ms) ? std::stod(m[1]) : -1;
}

// Rank 0's "snapshot.every auto: a snapshot every N steps in this world, ..." lines.
bool auto_line(const std::string& l) { return has(l, "snapshot.every auto: a snapshot every "); }

// The live side with snapshots, in its first world: rank 0's steady steps before its first
// snapshot and after it. snapshot.every auto's probe snapshot is copied beside the world's
// fifth step, whose line comes right before the auto line; the world's first step (traced)
// and that one are left out of "before". Waits for the auto line and four steps after it.
void steady_steps(Run& run, SideResult& res) {
  const std::vector<size_t> zero(run.agents_.size(), 0);
  const Found a = run.wait_line(zero, "the first world's snapshot.every auto line",
                                [](int, const std::string& l) { return auto_line(l); });
  run.wait_steps(run.marks(), 4, "four steps after the first snapshot");
  std::vector<std::pair<double, double>> steps;  // (stamp, ms)
  for (const auto& ag : run.agents_)
    for (const StampedLine& l : ag->lines())
      if (step_of(l.text) >= 0 && step_ms(l.text) >= 0) steps.push_back({l.t, step_ms(l.text)});
  std::sort(steps.begin(), steps.end());
  std::vector<double> before;
  for (const auto& [t, ms] : steps) (t < a.line.t ? before : res.steps_after).push_back(ms);
  if (before.size() > 2) res.steps_before.assign(before.begin() + 1, before.end() - 1);
}

// Before the failure's kill: every node of the world of `epoch` holds a peer's copy of its
// snapshot of that epoch (its snapshot agent's "holding replicas of node ..." or "holding
// parity fragment ..." line), then two more steps, for the copy's bytes to land; a node lost
// whole then resumes from its copy of this world, not an older world's nor step 0.
void wait_snapshots_held(Run& run, long long epoch) {
  const bool ec = run.o_.spec.snapshot.redundancy == "ec";
  const std::string tag = str("(epoch ", epoch, ")");
  int members = 0;
  for (size_t i = 0; i < run.agents_.size(); ++i)
    members += run.agents_[i]->running() && !run.gone_.count(int(i));
  std::set<int> held;
  run.wait_line(std::vector<size_t>(run.agents_.size(), 0),
                str("every node's snapshot of epoch ", epoch, " held by a peer"),
                [&](int i, const std::string& l) {
                  if (!run.gone_.count(i) && has(l, tag.c_str()) &&
                      has(l, ec ? "holding parity fragment " : "holding replicas of node "))
                    held.insert(i);
                  return int(held.size()) >= members;
                });
  run.wait_steps(run.marks(), 2, "two steps after the snapshots were held");
}

}  // namespace

SideResult run_side(Options& o, bool live) {
  Run run(o, live);
  // The live side's snapshot agents keep their segments when their weft run is killed: the
  // agents go first, then the job's segments (the bench's, whatever happened).
  const bool snapshots = live && o.spec.snapshot.enabled();
  struct Cleanup {
    Run& run;
    bool snapshots;
    ~Cleanup() {
      // Their snapshot agents die with them, rather than at their own pace after weft run's
      // death (a SIGTERM), which may come after the segments' removal.
      if (snapshots)
        for (const auto& a : run.agents_)
          if (a->running())
            for (pid_t k : child_pids(a->pid())) ::kill(k, SIGKILL);
      run.agents_.clear();
      if (snapshots) snapbench::remove_job_segments(run.rdzv_id_, false);
    }
  } cleanup{run, snapshots};
  SideResult res;
  const char* side = live ? "reshard" : "restart";
  std::map<int, pid_t> first_workers;  // live: each first agent's worker
  std::vector<int> leavers;
  int world = 4;
  // A graceful leave of `k` agents (SIGTERM: a preemption notice, a scheduler shrinking the
  // job): the change `name`, world -> world - k.
  auto leave = [&](const std::string& name, int k) {
    Change c{name, "", world, world - k};
    const std::vector<int> v = run.victims(k);
    const std::vector<size_t> from = run.marks();
    c.cause = c.notice = run.now();
    for (int a : v) {
      ::kill(run.agents_[size_t(a)]->pid(), SIGTERM);
      run.gone_[a] = true;
    }
    std::string nodes;
    for (int a : v) nodes += (nodes.empty() ? "" : ", ") + std::to_string(run.index_[size_t(a)]);
    c.what = str("SIGTERM to ", k, " agent", k == 1 ? "" : "s", " (node", k == 1 ? " " : "s ",
                 nodes, ")");
    note(c.cause, str(side, " ", name, ": ", c.what));
    c.path.push_back({"SIGTERM", c.cause});
    if (live) {
      auto l = run.wait_line(from, "the leaving agent's leave", [&](int i, const std::string& s) {
        return run.gone_.count(i) && has(s, "leaves the job gracefully");
      });
      c.path.push_back({"agent leaves", l.line.t});
      auto n = run.wait_line(from, "the members' notice", [&](int i, const std::string& s) {
        return !run.gone_.count(i) && has(s, "its workers reshard live");
      });
      c.path.push_back({"members' notice", n.line.t});
      finish_change(run, c, from);
    } else {
      // The job stops everywhere; then the remaining nodes are relaunched.
      const double ended = run.wait_all_ended("end of the stopped job");
      if (auto s = run.find(from, [](int, const std::string& l) {
            return has(l, "interrupted: saved checkpoint");
          }))
        c.path.push_back({"saved at the notice", s->line.t});
      c.path.push_back({"every agent ended", ended});
      for (size_t i = 0; i < run.agents_.size(); ++i) run.gone_[int(i)] = true;
      run.relaunch_argv();
      run.host_ = -1;
      const std::vector<size_t> again = run.marks();
      for (int i = 0; i < c.to; ++i) run.start();
      note(run.now(), str("restart ", name, ": the job stopped; relaunched ", c.to,
                          " agents with --resume"));
      c.path.push_back({"relaunched", run.now()});
      run.wait_line(again, "the relaunched store's host", [&](int i, const std::string& l) {
        if (has(l, "serves the rendezvous store")) run.host_ = i;
        return run.host_ >= 0;
      });
      finish_change(run, c, again);
    }
    leavers.insert(leavers.end(), v.begin(), v.end());
    world = c.to;
    res.changes.push_back(c);
  };
  try {
    for (int i = 0; i < 4; ++i) run.start();
    note(run.now(), str(side, ": started 4 agents"));
    run.warm_up({});
    // The cost's split needs auto's probe line (a fixed interval from --set has none).
    if (snapshots && o.spec.snapshot.every == core::SnapshotSpec::kAuto) steady_steps(run, res);
    if (live)
      for (int i = 0; i < 4; ++i) first_workers[i] = worker_child(run.agents_[size_t(i)]->pid());
    if (o.leaves == "together") {
      leave("leave", 2);
    } else {  // one after the other: the first resize done before the second SIGTERM
      leave("leave-a", 1);
      leave("leave-b", 1);
    }
    {  // join: two agents start; the members' notice of them is the change known
      Change c{"join", "", 2, 4};
      const std::vector<size_t> from = run.marks();
      c.cause = run.now();
      const int j0 = run.start(), j1 = run.start();
      note(c.cause, str(side, " join: started agents ", j0, " and ", j1));
      c.path.push_back({"joiners started", c.cause});
      auto n = run.wait_line(from, "the members' notice of the join", [&](int i, const std::string& l) {
        return i != j0 && i != j1 &&
               (live ? has(l, "its workers reshard live") : has(l, "weft run: membership changed"));
      });
      c.notice = n.line.t;
      c.what = str("2 agents start; the members' notice ", fixed3(c.notice - c.cause),
                   " s after");
      c.path.push_back({"members' notice", c.notice});
      finish_change(run, c, from);
      if (!live)
        if (auto s = run.find(from, [](int, const std::string& l) {
              return has(l, "interrupted: saved checkpoint");
            }))
          c.path.push_back({"saved at the notice", s->line.t});
      res.changes.push_back(c);
    }
    {  // failure: an agent SIGKILLed with its worker; the change is known at its detection
      Change c{"failure", "", 4, 3};
      // Snapshots kept on their own node only (redundancy none, a --set under a layout that
      // loses nothing) have no copy to wait for.
      if (snapshots && o.spec.snapshot.redundancy != "none")
        wait_snapshots_held(run, res.changes.back().epoch);
      const int v = run.victims(1)[0];
      const std::vector<size_t> from = run.marks();
      // The node lost whole: its snapshot agent too (weft run's death only SIGTERMs it).
      const std::vector<pid_t> kids =
          snapshots ? child_pids(run.agents_[size_t(v)]->pid()) : std::vector<pid_t>{};
      c.cause = run.now();
      run.agents_[size_t(v)]->kill();
      for (pid_t k : kids) ::kill(k, SIGKILL);
      run.gone_[v] = true;
      c.what = str("SIGKILL of node ", run.index_[size_t(v)], "'s agent");
      note(c.cause, str(side, " failure: ", c.what));
      c.path.push_back({"SIGKILL", c.cause});
      auto d = run.wait_line(from, "detection", [&](int i, const std::string& l) {
        return i != v && has(l, "weft run: membership changed");
      });
      c.notice = d.line.t;
      c.path.push_back({"detected", c.notice});
      finish_change(run, c, from);
      res.changes.push_back(c);
    }
  } catch (const Error& e) {
    print_tails(run.agents_, o.dir);
    throw Error(str(side, ": ", e.what(), " (logs in ", o.dir.string(), ")"));
  }
  // The first agents that lived through every change kept their workers' processes.
  int lived = 0;
  bool k = live;
  for (const auto& [agent, worker] : first_workers)
    if (!run.gone_.count(agent)) {
      ++lived;
      k = k && worker > 0 && worker_child(run.agents_[size_t(agent)]->pid()) == worker;
    }
  res.kept_workers = k && lived == 2;
  // The leavers' exit codes (live: they hand over, then their agents exit 0 a little later).
  for (double until = run.now() + 10; run.now() < until;) {
    bool any = false;
    for (int a : leavers) any = any || run.agents_[size_t(a)]->running();
    if (!any) break;
    pump_agents(run.agents_, 50);
  }
  for (int a : leavers) {
    const BenchAgent& l = *run.agents_[size_t(a)];
    res.leaver_codes.push_back(l.exit_code());
    if (live && !find_from(l, 0, [](const std::string& t) { return has(t, "its workers handed their state over"); }))
      res.stuck.push_back(str("agent ", a, " (pid ", l.pid(), ")"));
  }
  std::vector<std::pair<double, std::string>> autos;
  for (const auto& ag : run.agents_)
    for (const StampedLine& l : ag->lines())
      if (auto_line(l.text)) autos.push_back({l.t, l.text});
  std::sort(autos.begin(), autos.end());
  for (const auto& [t, l] : autos) res.auto_lines.push_back(l);
  return res;  // Cleanup: SIGKILL and reap the agents (their workers die with them)
}

int run_reshard(Options& o, bool both) {
  const core::JobSpec& s = o.spec;
  std::printf("weft bench elastic --mode %s: planned changes and a failure on one job%s\n",
              both ? "both" : "reshard", both ? " per side" : "");
  std::printf(
      "  4 nodes x 1 worker on 127.0.0.1: weft run --nnodes 2:4, heartbeat_timeout %g s; "
      "%s, join 2 -> 4 (2 agents started), failure 4 -> 3 (an agent SIGKILLed)\n",
      heartbeat_seconds(o),
      o.leaves == "together" ? "leave 4 -> 2 (2 agents SIGTERMed at once)"
                             : "leave-a 4 -> 3 and leave-b 3 -> 2 (an agent SIGTERMed each)");
  std::printf(
      "  model: %s %lld x %lld, vocab %lld, seq %lld: %.2fM parameters, f32, Adam, parallel.zero "
      "%lld, global_batch %lld, train.threads %d\n",
      s.model.arch.c_str(), (long long)s.model.layers, (long long)s.model.dim,
      (long long)s.model.vocab, (long long)s.model.seq_len, o.params / 1e6,
      (long long)s.parallel.zero, (long long)s.train.global_batch, o.threads);
  std::printf("  state: 16 B/parameter = %s per rank; estimated %s for 4 ranks (%s available)\n",
              gb(16 * o.params).c_str(), gb(4 * planner::estimate_memory(s, 4).total()).c_str(),
              gb(double(planner::available_memory_bytes())).c_str());
  std::printf("  %s\n", o.snapshot_header.c_str());
  o.memcpy_bps = memcpy_bytes_per_second(size_t(256) << 20);
  std::printf("  memcpy: %.2f GB/s (one thread, 256 MiB into touched memory, best of 5): the "
              "transfers' ratio below\n",
              o.memcpy_bps / 1e9);
  std::fflush(stdout);

  const std::string token = comm::auth::generate_token();
  ::setenv("WEFT_JOB_TOKEN", token.c_str(), 1);
  std::optional<SideResult> restart;
  SideResult live;
  try {
    if (both) {
      Options r = o;  // the same job, checkpoint-restarted
      r.mode = "restart";
      r.live_sets.clear();
      r.dir = o.dir / "restart";
      fs::create_directories(r.dir);
      restart = run_side(r, false);
    }
    Options l = o;
    l.dir = o.dir / "reshard";
    fs::create_directories(l.dir);
    live = run_side(l, true);
  } catch (const Error& e) {
    std::fprintf(stderr, "weft bench elastic: failed: %s\n", e.what());
    return 1;
  }
  print_planned(o, live, restart ? &*restart : nullptr);
  bool graceful = true;
  for (int code : live.leaver_codes) graceful = graceful && code == 0;
  const bool ok = live.kept_workers && graceful;
  std::printf("job: %s\n",
              ok ? "ok: every change resharded live through the router; the leaving agents exited "
                   "0; the two nodes that lived through every change kept their worker processes"
                 : !graceful ? "a leaving agent did not exit 0"
                             : "the survivors' workers did not keep their processes");
  if (o.own_dir && !o.keep) {
    std::error_code ec;
    fs::remove_all(o.dir, ec);
  } else {
    std::printf("logs (<side>/agent-<i>.log, lines stamped in seconds) kept in %s\n", o.dir.c_str());
  }
  return ok ? 0 : 1;
}

}  // namespace weft::launch::bench
