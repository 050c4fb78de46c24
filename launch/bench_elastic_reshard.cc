// `weft bench elastic --mode reshard`: one live job (elastic.on_change: reshard) on 4 agents
// shrinks (two workers SIGKILLed), grows (an agent joins) and loses a node (an agent
// SIGKILLed); per change the downtime, the resize line's phases, the bytes moved and the
// workers' peak RSS, beside the restart baseline when --mode both measured it.
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <sstream>

#include "base/check.h"
#include "base/error.h"
#include "comm/store/auth.h"
#include "launch/bench_elastic_parts.h"
#include "planner/memory_estimate.h"

namespace weft::launch::bench {
namespace {

using Agents = std::vector<std::unique_ptr<BenchAgent>>;

// One change, as the bench saw it.
struct Change {
  std::string name, what;
  int from = 0, to = 0;
  double t0 = 0;        // the kill, or (grow) the survivors' notice
  double detect = -1;   // failure: the kill -> a survivor names the change
  // shrink: the kill -> each killed worker's agent reaped it. A SIGKILLed process's sockets
  // close and its exit is seen only once the kernel has freed its memory (exit_mm comes
  // before exit_files), about 2 GB here: the part of the shrink that no agent can wait less.
  std::vector<double> reaped;
  double admit = -1;    // grow: the agent's start -> the survivors' notice
  double ready = 0;     // t0 -> the resize line (the new world ready to step)
  double downtime = 0;  // t0 -> the new world's first step line
  double again = 0, membership = 0, communicators = 0, plan = 0, transfer = 0, resume = 0;
  double mib_between = 0, mib_kept = 0, mib_copied = 0, mib_min = 0;  // kept, copied: rank 0's
  int holders = 0;
  std::vector<double> hwm_gib;  // the live workers' VmHWM after the change
};

std::string fixed(double x, int digits = 3) {
  char b[32];
  std::snprintf(b, sizeof b, "%.*f", digits, x);
  return b;
}

std::string slurp_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The worker of the agent `pid`: its child with a rank in its environment (the agent also
// forks a guardian, which has none); -1 when none.
pid_t worker_of(pid_t pid) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string n = e.path().filename().string();
    if (n.find_first_not_of("0123456789") != std::string::npos) continue;
    std::istringstream in(slurp_file(e.path() / "stat"));
    std::string pidtext, comm, state;
    long ppid = 0;
    in >> pidtext >> comm >> state >> ppid;
    if (ppid == pid && slurp_file(e.path() / "environ").find("WEFT_RANK=") != std::string::npos)
      return pid_t(std::stol(n));
  }
  return -1;
}

// VmHWM of `pid` in GiB, or -1.
double hwm_gib(pid_t pid) {
  std::istringstream in(slurp_file(fs::path("/proc") / std::to_string(pid) / "status"));
  for (std::string l; std::getline(in, l);)
    if (l.rfind("VmHWM:", 0) == 0) return std::atof(l.c_str() + 6) / (1024.0 * 1024.0);
  return -1;
}

std::vector<std::string> reshard_argv(const Options& o, int port) {
  const std::string self = self_exe();
  const double hb = heartbeat_seconds(o);
  std::vector<std::string> v = {self, "run", "--nnodes", "2:4", "--nproc-per-node", "1",
                                "--max-restarts", "0"};
  v.insert(v.end(), {"--rdzv-id", "bench-reshard-" + std::to_string(::getpid())});
  v.insert(v.end(), {"--rdzv-endpoint", "127.0.0.1:" + std::to_string(port)});
  v.insert(v.end(), {"--rdzv-conf", str("heartbeat_interval=", hb / 5, ",heartbeat_timeout=", hb)});
  v.insert(v.end(), {"--", self, "train", "--config", o.config});
  for (const std::string& s : train_sets(o, int(o.spec.model.layers))) v.insert(v.end(), {"--set", s});
  v.insert(v.end(), {"--set", "elastic.on_change=reshard"});
  return v;
}

class Run {
 public:
  Run(Options& o) : o_(o), argv_(reshard_argv(o, free_port())), origin_(BenchAgent::Clock::now()) {}

  double now() const {
    return std::chrono::duration<double>(BenchAgent::Clock::now() - origin_).count();
  }
  int start() {
    agents_.push_back(std::make_unique<BenchAgent>(
        argv_, (o_.dir / ("agent-" + std::to_string(agents_.size()) + ".log")).string(), origin_));
    index_.push_back(-1);
    return int(agents_.size()) - 1;
  }
  std::vector<size_t> marks() const {
    std::vector<size_t> m;
    for (const auto& a : agents_) m.push_back(a->lines().size());
    return m;
  }
  // Pumps until `match` holds for a line of some agent after `from`; the line's agent and
  // stamp. Throws Error when an agent not in gone_ ended, or at --timeout.
  std::pair<int, StampedLine> wait_line(const std::vector<size_t>& from, const std::string& what,
                                        const std::function<bool(int, const std::string&)>& match) {
    for (;;) {
      for (size_t i = 0; i < agents_.size(); ++i) {
        const auto& v = agents_[i]->lines();
        for (size_t k = i < from.size() ? from[i] : 0; k < v.size(); ++k) {
          if (auto n = node_line(v[k].text)) index_[i] = n->first;
          std::smatch m;  // a live agent's new place: "...; node X is node I of M, its workers"
          static const std::regex live(R"(is node (\d+) of \d+, its workers reshard live)");
          if (std::regex_search(v[k].text, m, live)) index_[i] = std::stoi(m[1]);
          if (match(int(i), v[k].text)) return {int(i), v[k]};
        }
      }
      for (size_t i = 0; i < agents_.size(); ++i)
        if (!agents_[i]->running() && !gone_.count(int(i)))
          throw Error(str("agent ", i, " (pid ", agents_[i]->pid(), ") exited with code ",
                          agents_[i]->exit_code(), " while waiting for ", what));
      if (now() > o_.timeout) throw Error(str("no ", what, " within --timeout ", o_.timeout, " s"));
      pump_agents(agents_, 50);
    }
  }
  // The new world's first step after a resize into `to` ranks; fills the change's numbers.
  void finish_change(Change& c, const std::vector<size_t>& from) {
    const std::string want = str("world ", c.from, " -> ", c.to, " (");
    auto [lead, line] = wait_line(from, "resize line (" + want + ")", [&](int, const std::string& s) {
      return s.rfind("[rank 0] resize: ", 0) == 0 && has(s, want.c_str());
    });
    parse_resize(c, line.text);
    c.ready = line.t - c.t0;
    auto first = wait_line(from, "first step of the new world", [&](int, const std::string& s) {
      return step_of(s) >= 0 && has(s, str(" world ", c.to, " after a resize of ").c_str());
    });
    c.downtime = first.second.t - c.t0;
    for (size_t i = 0; i < agents_.size(); ++i)
      if (agents_[i]->running())
        if (pid_t w = worker_of(agents_[i]->pid()); w > 0) c.hwm_gib.push_back(hwm_gib(w));
    note(first.second.t, str(c.name, ": the world of ", c.to, " logged its first step, ",
                             fixed(c.downtime), " s after ", c.name == "grow" ? "the notice" : "the kill"));
    // Two more steps: the new world trains before the next change.
    const std::vector<size_t> m = marks();
    int seen = 0;
    wait_line(m, "two steps of the new world", [&](int, const std::string& s) {
      return step_of(s) >= 0 && ++seen >= 2;
    });
  }
  void parse_resize(Change& c, const std::string& s) {
    static const std::regex router(
        R"(state from (\d+) holders? through the router \(([\d.e+-]+) MiB between ranks; rank 0 kept ([\d.e+-]+) MiB in place and copied ([\d.e+-]+) MiB)");
    static const std::regex again(
        R"(training again ([\d.]+) s after the change \(membership ([\d.]+), communicators ([\d.]+), plan ([\d.]+), read snapshots ([\d.]+), transfer ([\d.]+), resume ([\d.]+)\))");
    std::smatch m;
    if (!std::regex_search(s, m, router))
      throw Error("the resize did not take its state from the survivors: " + s);
    c.holders = std::stoi(m[1]);
    c.mib_between = std::stod(m[2]);
    c.mib_kept = std::stod(m[3]);
    c.mib_copied = std::stod(m[4]);
    if (!std::regex_search(s, m, again)) throw Error("no phases in the resize line: " + s);
    c.again = std::stod(m[1]);
    c.membership = std::stod(m[2]);
    c.communicators = std::stod(m[3]);
    c.plan = std::stod(m[4]);
    c.transfer = std::stod(m[5]) + std::stod(m[6]);  // this bench takes no snapshots: 0 + transfer
    c.resume = std::stod(m[7]);
  }
  // Agents in this epoch, by node index, that neither host the store nor lead: the last ones.
  std::vector<int> victims(int n) const {
    std::vector<int> v;
    for (size_t i = 0; i < agents_.size(); ++i)
      if (agents_[i]->running() && !gone_.count(int(i)) && int(i) != host_ && index_[i] > 0)
        v.push_back(int(i));
    std::sort(v.begin(), v.end(), [&](int a, int b) { return index_[size_t(a)] > index_[size_t(b)]; });
    if (int(v.size()) < n) throw Error(str("fewer than ", n, " nodes to kill"));
    v.resize(size_t(n));
    return v;
  }

  Options& o_;
  std::vector<std::string> argv_;
  BenchAgent::Clock::time_point origin_;
  Agents agents_;
  std::vector<int> index_;
  std::map<int, bool> gone_;  // agents that are meant to end
  int host_ = -1;
};

void print_changes(const Options& o, const std::vector<Change>& cs,
                   const std::optional<RestartResult>& restart) {
  const double replica_mib = 12 * o.params / (1024.0 * 1024.0);  // f32 weights, Adam's m and v
  std::printf("\n%-8s | %-7s | %9s | %9s | %9s | %7s | %s\n", "change", "world", "downtime",
              "detect", "restart", "ratio", "how");
  for (const Change& c : cs) {
    double base = -1;
    std::string basis;
    if (restart) {
      base = c.name == "failure" ? restart->total : restart->total - restart->detect;
      basis = c.name == "failure" ? "" : " (restart less its detect)";
    }
    std::printf("%-8s | %d -> %-2d | %9.3f | %9s | %9s | %7s | %s%s\n", c.name.c_str(), c.from,
                c.to, c.downtime, c.detect >= 0 ? fixed(c.detect).c_str() : "-",
                base >= 0 ? fixed(base).c_str() : "-",
                base >= 0 && c.downtime > 0 ? (fixed(base / c.downtime, 1) + "x").c_str() : "-",
                c.what.c_str(), basis.c_str());
  }
  if (restart) {
    // The same ratio without the first step: a step takes as long on either side (8-10 s for
    // the default model on 2 cores) and bounds the ratio above, so this one compares only
    // the time with no training: to the resize line (ready to step) here, to "checkpoint:
    // resumed" there, both stamped on arrival from the same start as the downtime.
    std::printf("\n%-8s | %9s | %9s | %7s | %s\n", "ready", "reshard", "restart", "ratio",
                "to ready to step, from the same start as the downtime");
    for (const Change& c : cs) {
      const bool failure = c.name == "failure";
      const double base = failure ? restart->ready : restart->ready - restart->detect;
      std::printf("%-8s | %9.3f | %9.3f | %7s | %s\n", c.name.c_str(), c.ready, base,
                  c.ready > 0 ? (fixed(base / c.ready, 1) + "x").c_str() : "-",
                  failure ? "restart: detect, rendezvous, restart, load"
                          : "restart: rendezvous, restart, load");
    }
  }
  std::printf("\n%-8s | %10s | %11s | %5s | %8s | %6s | %6s | %s\n", "phases", "membership",
              "communicators", "plan", "transfer", "resume", "total", "as the new rank 0 saw it");
  for (const Change& c : cs)
    std::printf("%-8s | %10.2f | %11.2f | %5.2f | %8.2f | %6.2f | %6.2f | %s\n", c.name.c_str(),
                c.membership, c.communicators, c.plan, c.transfer, c.resume, c.again,
                c.name == "grow" ? "the notice -> ready to step" : "the change known -> ready to step");
  std::printf("\n%-8s | %7s | %12s | %12s | %9s | %11s | %s\n", "bytes", "holders",
              "MiB between", "MiB minimum", "MiB kept", "MiB copied",
              "peak RSS per live worker (VmHWM, GiB)");
  for (const Change& c : cs) {
    std::string hwm;
    for (double g : c.hwm_gib) hwm += (hwm.empty() ? "" : " ") + fixed(g, 2);
    const double min = c.to > c.from ? (c.to - c.from) * replica_mib : 0;
    std::printf("%-8s | %7d | %12.1f | %12.1f | %9.1f | %11.1f | %s\n", c.name.c_str(), c.holders,
                c.mib_between, min, c.mib_kept, c.mib_copied, hwm.c_str());
  }
  for (const Change& c : cs) {
    if (c.reaped.empty()) continue;
    std::string r;
    for (double t : c.reaped) r += (r.empty() ? "" : ", ") + fixed(t);
    std::printf("%s: the kill -> each killed worker reaped by its agent: %s s (the kernel frees a "
                "SIGKILLed process's memory before its sockets close and its exit is seen)\n",
                c.name.c_str(), r.c_str());
  }
  std::printf(
      "minimum: a DP shrink or loss moves nothing (every survivor holds a full replica); a "
      "newcomer needs one\nreplica, 12 B/parameter (f32 weights, Adam's m and v) = %.1f MiB.\n",
      replica_mib);
  std::printf(
      "targets (not asserted): downtime at least 30x shorter than checkpoint-restart on every "
      "change,\n100x where no bytes move.\n");
}

}  // namespace

int run_reshard(Options& o, const std::optional<RestartResult>& restart) {
  const core::JobSpec& s = o.spec;
  std::printf("weft bench elastic --mode reshard: online resize of one live job\n");
  std::printf(
      "  4 nodes x 1 worker on 127.0.0.1: weft run --nnodes 2:4 --max-restarts 0, "
      "heartbeat_timeout %g s, elastic.on_change reshard\n",
      heartbeat_seconds(o));
  std::printf(
      "  model: %s %lld x %lld, vocab %lld, seq %lld: %.2fM parameters, f32, Adam, parallel.zero "
      "%lld, global_batch %lld, train.threads %d\n",
      s.model.arch.c_str(), (long long)s.model.layers, (long long)s.model.dim,
      (long long)s.model.vocab, (long long)s.model.seq_len, o.params / 1e6,
      (long long)s.parallel.zero, (long long)s.train.global_batch, o.threads);
  std::printf("  state: 16 B/parameter = %s per rank; estimated %s for 4 ranks (%s available)\n",
              gb(16 * o.params).c_str(),
              gb(4 * planner::estimate_memory(s, 4).total()).c_str(),
              gb(double(planner::available_memory_bytes())).c_str());
  std::fflush(stdout);

  const std::string token = comm::auth::generate_token();
  ::setenv("WEFT_JOB_TOKEN", token.c_str(), 1);
  Run run(o);
  std::vector<Change> changes;
  std::vector<std::pair<int, pid_t>> kept_workers;  // (agent, worker) of the shrink's survivors
  try {
    for (int i = 0; i < 4; ++i) run.start();
    note(run.now(), "started 4 agents");
    run.wait_line({}, "the store's host", [&](int i, const std::string& l) {
      if (has(l, "serves the rendezvous store")) run.host_ = i;
      return run.host_ >= 0;
    });
    int warm = 0;
    run.wait_line({}, "three steps of the world of 4", [&](int, const std::string& l) {
      return step_of(l) >= 0 && ++warm >= 3;
    });

    {  // shrink: the workers of the two last nodes die; their agents leave at once
      Change c{"shrink", "", 4, 2};
      const std::vector<int> v = run.victims(2);
      std::vector<pid_t> w;
      for (int a : v) w.push_back(worker_of(run.agents_[size_t(a)]->pid()));
      if (std::count(w.begin(), w.end(), -1)) throw Error("no worker found under an agent");
      const std::vector<size_t> from = run.marks();
      c.t0 = run.now();
      for (size_t k = 0; k < w.size(); ++k) {
        ::kill(w[k], SIGKILL);
        run.gone_[v[k]] = true;
      }
      c.what = str("SIGKILL of 2 workers (nodes ", run.index_[size_t(v[0])], ", ",
                   run.index_[size_t(v[1])], "); their agents leave at once");
      note(c.t0, "shrink: " + c.what);

      for (int i = 0; i < 4; ++i)
        if (!run.gone_.count(i)) kept_workers.push_back({i, worker_of(run.agents_[size_t(i)]->pid())});
      run.finish_change(c, from);
      for (int a : v)  // said before the agent left, so before the new world formed
        if (auto m = find_from(*run.agents_[size_t(a)], from[size_t(a)], [](const std::string& l) {
              return has(l, "was killed by signal");
            }))
          c.reaped.push_back(m->t - c.t0);
      changes.push_back(c);
    }
    {  // grow: a new agent joins and is admitted about two heartbeat intervals later
      Change c{"grow", "", 2, 3};
      const std::vector<size_t> from = run.marks();
      const double started = run.now();
      const int k = run.start();
      note(started, str("grow: started agent ", k));
      auto notice = run.wait_line(from, "the survivors' notice of the join", [&](int i, const std::string& l) {
        return i != k && has(l, "its workers reshard live");
      });
      c.t0 = notice.second.t;
      c.admit = c.t0 - started;
      c.what = str("a node joins; admitted ", fixed(c.admit, 2),
                   " s after its agent started (the old world trains meanwhile)");
      run.finish_change(c, from);
      changes.push_back(c);
    }
    {  // failure: a node's agent dies with its worker; noticed when its store connection
       // closes (a host that vanishes without closing it: when its heartbeat expires)
      Change c{"failure", "", 3, 2};
      const int v = run.victims(1)[0];
      const std::vector<size_t> from = run.marks();
      c.t0 = run.now();
      run.agents_[size_t(v)]->kill();
      run.gone_[v] = true;
      c.what = str("SIGKILL of node ", run.index_[size_t(v)], "'s agent; noticed when its store connection closes");
      note(c.t0, "failure: " + c.what);
      auto d = run.wait_line(from, "detection", [&](int i, const std::string& l) {
        return i != v && has(l, "weft run: membership changed");
      });
      c.detect = d.second.t - c.t0;
      run.finish_change(c, from);
      changes.push_back(c);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "weft bench elastic: failed: %s\n", e.what());
    print_tails(run.agents_, o.dir);
    std::fprintf(stderr, "logs kept in %s\n", o.dir.c_str());
    return 1;
  }
  // The job ended ok: every change took its state from the survivors, and the two nodes that
  // lived through all three kept their worker processes.
  bool kept = kept_workers.size() == 2;
  for (const auto& [agent, worker] : kept_workers)
    kept = kept && worker > 0 && worker_of(run.agents_[size_t(agent)]->pid()) == worker;
  run.agents_.clear();  // SIGKILL and reap: their workers die with them
  print_changes(o, changes, restart);
  std::printf("job: %s\n", kept ? "ok: every change resharded live through the router; the two "
                                  "nodes that lived through all three kept their worker processes"
                                : "the survivors' workers did not keep their processes");
  if (o.own_dir && !o.keep) {
    std::error_code ec;
    fs::remove_all(o.dir, ec);
  } else {
    std::printf("logs (agent-<i>.log, lines stamped in seconds) kept in %s\n", o.dir.c_str());
  }
  return kept ? 0 : 1;
}

}  // namespace weft::launch::bench
