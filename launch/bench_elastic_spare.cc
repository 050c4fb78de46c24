// weft bench elastic --mode spare: a node lost whole while a spare waits, on a live job
// (elastic.on_change: reshard: the spare's worker enters as a newcomer and receives a replica
// through the router) and on a checkpoint-restarted one (restart: every worker starts again
// in the new epoch and loads the latest checkpoint), side by side in one run. --weft BIN runs
// the agents and workers of another build (named `weft`), so that two builds compare on the
// same bench.
#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "base/check.h"
#include "base/error.h"
#include "base/proc.h"
#include "comm/store/auth.h"
#include "launch/bench_elastic_parts.h"
#include "launch/bench_snapshot_parts.h"

namespace weft::launch::bench {
namespace {

using Clock = BenchAgent::Clock;

std::vector<std::string> spare_argv(const Options& o, const std::string& bin, bool live, int port) {
  const double hb = heartbeat_seconds(o);
  std::vector<std::string> v = {
      bin, "run", "--nnodes", "2:3", "--nproc-per-node", "1", "--max-restarts", live ? "0" : "1"};
  v.insert(v.end(), {"--rdzv-id", str("bench-spare-", live ? "reshard-" : "restart-", ::getpid())});
  v.insert(v.end(), {"--rdzv-endpoint", "127.0.0.1:" + std::to_string(port)});
  v.insert(v.end(), {"--rdzv-conf", str("heartbeat_interval=", hb / 5, ",heartbeat_timeout=", hb)});
  v.insert(v.end(), {"--", bin, "train", "--config", o.config});
  for (const std::string& s : train_sets(o, int(o.spec.model.layers)))
    v.insert(v.end(), {"--set", s});
  v.insert(v.end(), {"--set", live ? "elastic.on_change=reshard" : "elastic.on_change=restart"});
  // The checkpoint side: a checkpoint every 2 steps, the kill right after the first (its
  // best case); no snapshots on either side (every rank holds a whole replica).
  if (!live && !user_sets(o, "checkpoint.every"))
    v.insert(v.end(), {"--set", "checkpoint.every=2"});
  v.insert(v.end(), {"--set", "snapshot.every=0"});
  return v;
}

struct SpareSide {
  bool parked = false;   // the spare's worker was started before the loss, and parked
  double parked_s = -1;  // what it prepared while parked (its line)
  double detect = -1;    // from the kill: a survivor's agent names the change
  double ready = -1;     // the new rank 0 says it trains again (resize line / checkpoint loaded)
  double first = -1;     // the new world's first step line
  std::string resize;    // the live side's resize line
};

class SpareRun {
 public:
  SpareRun(Options& o, const std::string& bin, bool live)
      : o_(o), live_(live), origin_(Clock::now()), argv_(spare_argv(o, bin, live, free_port())) {}
  ~SpareRun() {
    for (const auto& a : agents_)  // the whole node: its worker too
      if (a->running())
        for (pid_t k : child_pids(a->pid())) ::kill(k, SIGKILL);
    agents_.clear();
  }

  double now() const { return std::chrono::duration<double>(Clock::now() - origin_).count(); }
  int start() {
    const std::string log =
        (o_.dir / str(live_ ? "reshard" : "restart", "-agent-", agents_.size(), ".log")).string();
    agents_.push_back(std::make_unique<BenchAgent>(argv_, log, origin_));
    return int(agents_.size()) - 1;
  }
  std::vector<size_t> marks() const {
    std::vector<size_t> m;
    for (const auto& a : agents_) m.push_back(a->lines().size());
    return m;
  }
  // The first line (from `from`; agents started since: from their start) that `match`
  // accepts; waits at most `limit` s (nullopt then), throws when an agent not `gone` ended or
  // at --timeout.
  std::optional<std::pair<int, StampedLine>> wait(
      const std::vector<size_t>& from, const std::string& what,
      const std::function<bool(int, const std::string&)>& match, double limit = 1e9) {
    const double t0 = now();
    for (;;) {
      for (size_t i = 0; i < agents_.size(); ++i) {
        const auto& v = agents_[i]->lines();
        for (size_t k = i < from.size() ? from[i] : 0; k < v.size(); ++k)
          if (match(int(i), v[k].text)) return std::make_pair(int(i), v[k]);
      }
      for (size_t i = 0; i < agents_.size(); ++i)
        if (!agents_[i]->running() && int(i) != gone_)
          throw Error(str("agent ", i, " (pid ", agents_[i]->pid(), ") exited with code ",
                          agents_[i]->exit_code(), " while waiting for ", what));
      if (now() > o_.timeout) throw Error(str("no ", what, " within --timeout ", o_.timeout, " s"));
      if (now() - t0 > limit) return std::nullopt;
      pump_agents(agents_, 20);
    }
  }
  const BenchAgent& agent(int i) const { return *agents_[size_t(i)]; }
  void kill(int i) {
    gone_ = i;
    const std::vector<pid_t> kids = child_pids(agents_[size_t(i)]->pid());
    agents_[size_t(i)]->kill();
    for (pid_t k : kids) ::kill(k, SIGKILL);  // its worker dies with it, as on a node's death
  }

 private:
  Options& o_;
  bool live_;
  Clock::time_point origin_;
  std::vector<std::string> argv_;
  std::vector<std::unique_ptr<BenchAgent>> agents_;
  int gone_ = -1;
};

bool rank0_step(const std::string& l) { return step_of(l) >= 0; }

SpareSide run_spare_side(Options& o, const std::string& bin, bool live) {
  SpareRun run(o, bin, live);
  SpareSide r;
  const char* side = live ? "reshard" : "restart";
  int host = -1;
  run.start();
  run.wait({}, "the store's host", [&](int i, const std::string& l) {
    if (has(l, "serves the rendezvous store")) host = i;
    return host >= 0;
  });
  run.start();
  run.start();
  // Counted by step number: wait() looks at every line again on each pass.
  std::set<long long> steps;
  auto count = [&](size_t n) {
    return [&steps, n](int, const std::string& l) {
      if (long long s = step_of(l); s >= 0) steps.insert(s);
      return steps.size() >= n;
    };
  };
  run.wait({}, "three steps of the first world", count(3));
  if (!live)
    run.wait({}, "the first checkpoint", [](int, const std::string& l) {
      return l.rfind("[rank 0] checkpoint: step ", 0) == 0 && has(l, " saved to ");
    });
  const int spare = run.start();
  run.wait({}, "the spare's line", [&](int i, const std::string& l) {
    return i == spare && has(l, "is registered as a spare of epoch");
  });
  note(run.now(), str(side, ": agent ", spare, " waits as a spare"));
  // A build that parks its spare's worker starts it now: wait until it is ready (its line);
  // one that does not has no worker under the spare's agent.
  const double t_spare = run.now();
  for (;;) {
    auto p = run.wait(
        {}, "the spare's parked worker",
        [&](int i, const std::string& l) {
          return i == spare && has(l, "waiting for its admission");
        },
        0.5);
    if (p) {
      r.parked = true;
      static const std::regex re(R"(faulted in, ([\d.]+) s; waiting)");
      std::smatch m;
      if (std::regex_search(p->second.text, m, re)) r.parked_s = std::stod(m[1]);
      break;
    }
    if (run.now() - t_spare > 3 && child_pids(run.agent(spare).pid()).size() < 2)
      break;  // the agent's guardian alone: no worker before the admission
  }
  note(run.now(),
       str(side, r.parked ? ": the spare's worker is parked" : ": the spare has no worker yet"));
  // The victim: a member that neither hosts the store nor leads (the last node index).
  int victim = -1, best = -1;
  for (int i = 0; i < spare; ++i) {
    if (i == host) continue;
    for (const StampedLine& l : run.agent(i).lines())
      if (auto n = node_line(l.text); n && n->first > best) best = n->first, victim = i;
  }
  if (victim < 0) throw Error("no member to kill (no node index seen)");
  steps.clear();
  run.wait(run.marks(), "two more steps", count(2));
  const std::vector<size_t> from = run.marks();
  const double t_kill = run.now();
  run.kill(victim);
  note(t_kill, str(side, ": killed agent ", victim, " and its worker (SIGKILL)"));
  r.detect = run.wait(from, "the loss's detection",
                      [&](int i, const std::string& l) {
                        return i != victim && has(l, "weft run: membership changed");
                      })
                 ->second.t -
             t_kill;
  int lead = -1;
  size_t lead_at = 0;
  const auto ready = run.wait(from, "the new world's ready line", [&](int i, const std::string& l) {
    const bool hit =
        live ? l.rfind("[rank 0] resize: epoch ", 0) == 0  // not the debug lines ("DEBUG resize:")
             : l.rfind("[rank 0] checkpoint: resumed from ", 0) == 0;
    if (hit) lead = i;
    return hit;
  });
  r.ready = ready->second.t - t_kill;
  if (live) r.resize = ready->second.text;
  const auto& lines = run.agent(lead).lines();
  for (size_t k = 0; k < lines.size(); ++k)
    if (lines[k].text == ready->second.text) lead_at = k;
  std::vector<size_t> after = run.marks();
  after[size_t(lead)] = lead_at + 1;
  r.first = run.wait(after, "the new world's first step",
                     [&](int i, const std::string& l) { return i == lead && rank0_step(l); })
                ->second.t -
            t_kill;
  note(run.now(), str(side, ": the world of 3 (the spare in) logged its first step ", r.first,
                      " s after the kill"));
  return r;
}

}  // namespace

int run_spare_bench(Options& o, const std::string& bin) {
  std::printf(
      "weft bench elastic --mode spare: 3 agents (--nnodes 2:3) and a spare on 127.0.0.1, "
      "%.2fM parameters with Adam (zero 0, dp auto), train.threads %d; one member lost "
      "whole (its agent and its worker SIGKILLed) 2 steps after the spare waits; agents "
      "and workers: %s\n",
      o.params / 1e6, o.threads, bin.c_str());
  std::fflush(stdout);
  const std::string token = comm::auth::generate_token();
  ::setenv("WEFT_JOB_TOKEN", token.c_str(), 1);
  SpareSide restart, live;
  try {
    restart = run_spare_side(o, bin, false);
    live = run_spare_side(o, bin, true);
  } catch (const Error& e) {
    std::fprintf(stderr, "weft bench elastic: failed: %s (logs in %s)\n", e.what(), o.dir.c_str());
    return 1;
  }
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  std::printf("\nfrom the kill (s)      | %9s | %9s | %s\n", "restart", "reshard",
              "restart / reshard");
  std::printf("detect                 | %9.3f | %9.3f | %8.1fx\n", restart.detect, live.detect,
              ratio(restart.detect, live.detect));
  std::printf("ready (rank 0's line)  | %9.3f | %9.3f | %8.1fx\n", restart.ready, live.ready,
              ratio(restart.ready, live.ready));
  std::printf("first step of world 3  | %9.3f | %9.3f | %8.1fx\n", restart.first, live.first,
              ratio(restart.first, live.first));
  std::printf("first step - detect    | %9.3f | %9.3f | %8.1fx\n", restart.first - restart.detect,
              live.first - live.detect,
              ratio(restart.first - restart.detect, live.first - live.detect));
  std::printf("spare's worker parked  | %9s | %9s |\n", restart.parked ? "yes" : "no",
              live.parked ? "yes" : "no");
  if (live.parked_s >= 0)
    std::printf("the parked worker prepared (plans, state faulted in) in %.2f s before the loss\n",
                live.parked_s);
  std::printf("reshard's resize line: %s\n", live.resize.c_str());
  if (o.own_dir && !o.keep) {
    std::error_code ec;
    fs::remove_all(o.dir, ec);
  } else {
    std::printf("logs (<side>-agent-<i>.log, lines stamped in seconds) kept in %s\n",
                o.dir.c_str());
  }
  return 0;
}

}  // namespace weft::launch::bench
