// `weft bench snapshot --parts node-loss`: a node lost whole (its weft run, worker and snapshot
// agent SIGKILLed at once) under ZeRO-3 over three nodes on 127.0.0.1, where the lost rank's
// shard exists nowhere else alive. Three runs of one job, side by side:
//   replica     elastic.on_change reshard, snapshot.redundancy replica: the survivors keep
//               their processes and take the lost shard from the replica its node pushed
//               to the next node before it died;
//   ec          the same with EC(2,1): the next node's agent rebuilds the lost rank from the
//               survivors' data and parity (fetch and decode) before the new world reads it;
//   checkpoint  elastic.on_change restart from a durable checkpoint saved right before the
//               kill, its page cache dropped: every worker restarts and loads the disk.
// Each is timed from the failure known (the first survivor's agent names the change; the
// heartbeat expiry that takes is detection, reported on its own) to ready to step and to
// the new world's first step, from lines of weft run's output stamped on arrival here; the
// step after it, a step of the same world on the same cores, is the first step's yardstick.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <regex>

#include "base/check.h"
#include "base/error.h"
#include "base/proc.h"
#include "comm/store/auth.h"
#include "launch/bench_elastic_parts.h"
#include "launch/bench_snapshot_parts.h"

namespace weft::launch::snapbench {
namespace {

constexpr int kNodes = 3;
// The kill: once this many steps are done (the snapshots of both slots written and
// replicated or coded: see ready_to_kill), or, for the checkpoint, once it is saved at this
// step. The job is stopped after the new world's first step; its step count never ends it.
constexpr int kKillDone = 6;
constexpr int kSteps = 100000;
constexpr double kTarget = 20;  // the issue: recovery >= 20x faster than the disk restart

struct Side {
  std::string name;  // replica | ec | checkpoint
  bool live() const { return name != "checkpoint"; }
  int victim_node = -1;
  double t_kill = -1, t_detect = -1, t_ready = -1, t_first = -1, t_second = -1;
  std::string detect_line;
  // The live sides: the new rank 0's resize line.
  long long resumed = -1, back = -1;
  long long every = 0;  // the interval snapshot.every auto chose (rank 0's line)
  std::string origins;
  double mib = 0, again = 0, membership = 0, comms = 0, plan = 0, read = 0, transfer = 0,
         resume = 0;
  // ec: the agent's rebuild line.
  double rebuild_ms = -1, ask_ms = 0, fetch_decode_ms = 0, rebuilt_mib = 0;
  std::string rebuild_parts;  // of fetch and decode, in ms, as the line names them
  // ec: when the rebuilding agent began ("is lost: rebuilding", once the new epoch's ring
  // reached it) and ended ("rebuilt node"), stamped on arrival here like the other lines.
  double t_rebuild_begin = -1, t_rebuild_end = -1;
  bool kept = false;  // the survivors' worker processes are the ones from before the kill
  // checkpoint: its phases, what was saved and how much of it stayed cached.
  bench::Phases ph;
  std::string saved;
  double cached = -1;
  double ready() const { return t_ready - t_detect; }
  double total() const { return t_first - t_detect; }
};

bool parse_resize(const std::string& l, Side& s) {
  static const std::regex from(
      R"(resumed at step (\d+) \((\d+) steps back\) from \d+ holders, \d+ of them in-memory snapshots \(([^)]*)\), through the router \(([\d.e+-]+) MiB between ranks\))");
  static const std::regex again(
      R"(training again ([\d.]+) s after the change \(membership ([\d.]+), communicators ([\d.]+), plan ([\d.]+), read snapshots ([\d.]+), transfer ([\d.]+), resume ([\d.]+)\))");
  std::smatch m;
  if (!std::regex_search(l, m, from)) return false;
  s.resumed = std::stoll(m[1]);
  s.back = std::stoll(m[2]);
  s.origins = m[3];
  s.mib = std::stod(m[4]);
  if (!std::regex_search(l, m, again)) return false;
  s.again = std::stod(m[1]);
  s.membership = std::stod(m[2]);
  s.comms = std::stod(m[3]);
  s.plan = std::stod(m[4]);
  s.read = std::stod(m[5]);
  s.transfer = std::stod(m[6]);
  s.resume = std::stod(m[7]);
  return true;
}

void parse_rebuild(const std::string& l, Side& s) {
  static const std::regex re(
      R"(rebuilt node \d+'s rank \d+ .*: ([\d.]+) MiB in ([\d.]+) ms \(asking the holders ([\d.]+) ms, fetch and decode ([\d.]+) ms(?:: ([^)]*))?)");
  std::smatch m;
  if (!std::regex_search(l, m, re)) return;
  s.rebuilt_mib = std::stod(m[1]);
  s.rebuild_ms = std::stod(m[2]);
  s.ask_ms = std::stod(m[3]);
  s.fetch_decode_ms = std::stod(m[4]);
  s.rebuild_parts = m[5];
}

class NodeRun {
 public:
  NodeRun(const Options& o, const JobShape& j, const std::string& side)
      : o_(o), origin_(BenchAgent::Clock::now()) {
    static int count = 0;
    folder_ = o.dir / str("node-loss-", j.name, "-", side, "-", ++count);
    fs::remove_all(folder_);
    fs::create_directories(folder_);
    rdzv_id_ = str("bench-node-loss-", ::getpid(), "-", count);
    const std::string self = bench::self_exe();
    std::vector<std::string> sets = {"train.steps=" + std::to_string(kSteps)};
    if (side == "checkpoint") {
      sets.insert(sets.end(), {"elastic.on_change=restart", "snapshot.every=0",
                               "checkpoint.dir=" + (folder_ / "checkpoints").string(),
                               "checkpoint.every=" + std::to_string(kKillDone)});
    } else {
      // auto: the interval a user gets by default, whose overhead holds the 1% target; the
      // table says which it chose.
      sets.insert(sets.end(), {"elastic.on_change=reshard", "snapshot.every=auto",
                               "snapshot.redundancy=" + side});
    }
    argv_ = {self, "run", "--nnodes", str(kNodes - 1, ":", kNodes), "--nproc-per-node", "1",
             "--max-restarts", side == "checkpoint" ? "1" : "0", "--rdzv-id", rdzv_id_,
             "--rdzv-endpoint", str("127.0.0.1:", bench::free_port()), "--", self, "train",
             "--config", j.config};
    for (const std::string& s : job_sets(o, j, folder_ / "run", sets))
      argv_.insert(argv_.end(), {"--set", s});
    for (int i = 0; i < kNodes; ++i)
      agents_.push_back(std::make_unique<BenchAgent>(
          argv_, (folder_ / str("agent-", i, ".log")).string(), origin_));
    index_.assign(kNodes, -1);
  }
  ~NodeRun() {
    agents_.clear();  // SIGKILL and reap: their workers and snapshot agents follow them
    remove_job_segments(rdzv_id_, false);
  }
  double now() const {
    return std::chrono::duration<double>(BenchAgent::Clock::now() - origin_).count();
  }
  const fs::path& folder() const { return folder_; }

  // Pumps until `match` holds for a line after `from` (per agent); that line's agent and
  // stamp. IoError when an agent other than the victim ends, or at --timeout.
  std::pair<int, StampedLine> wait_line(const std::vector<size_t>& from, const std::string& what,
                                        const std::function<bool(int, const std::string&)>& match) {
    for (;;) {
      for (int i = 0; i < kNodes; ++i) {
        const auto& v = agents_[size_t(i)]->lines();
        for (size_t k = from.empty() ? 0 : from[size_t(i)]; k < v.size(); ++k) {
          if (auto n = bench::node_line(v[k].text)) index_[size_t(i)] = n->first;
          if (match(i, v[k].text)) return {i, v[k]};
        }
      }
      for (int i = 0; i < kNodes; ++i)
        if (i != victim_ && !agents_[size_t(i)]->running())
          throw IoError(str("agent ", i, " exited with code ", agents_[size_t(i)]->exit_code(),
                            " while the bench waited for ", what, "\n", tails()));
      if (now() > o_.timeout)
        throw IoError(str("no ", what, " within --timeout ", o_.timeout, " s\n", tails()));
      pump_agents(agents_, 50);
    }
  }
  std::vector<size_t> marks() const {
    std::vector<size_t> m;
    for (const auto& a : agents_) m.push_back(a->lines().size());
    return m;
  }
  std::string tails() const {
    std::string s;
    for (size_t i = 0; i < agents_.size(); ++i) {
      const auto& v = agents_[i]->lines();
      s += str("--- agent ", i, " (", (folder_ / str("agent-", i, ".log")).string(), "):\n");
      for (size_t k = v.size() > 10 ? v.size() - 10 : 0; k < v.size(); ++k)
        s += "  " + v[k].text + "\n";
    }
    return s;
  }

  const Options& o_;
  BenchAgent::Clock::time_point origin_;
  fs::path folder_;
  std::string rdzv_id_;
  std::vector<std::string> argv_;
  std::vector<std::unique_ptr<BenchAgent>> agents_;
  std::vector<int> index_;  // node index of each agent in the current epoch
  int host_ = -1, victim_ = -1;
};

Side run_side(const Options& o, const JobShape& j, const std::string& name) {
  Side s;
  s.name = name;
  const std::string label = str("node-loss ", j.name, " ", name);
  progress(str(label, ": ", kNodes, " nodes; one is SIGKILLed whole once ", kKillDone,
               s.live() ? " steps are done and its snapshots are on other nodes"
                        : " steps are done and saved"));
  NodeRun run(o, j, name);
  // Before the kill: who hosts the store, the node indices, and the kill's condition.
  std::map<int, bool> covered;  // live: agents that hold a peer's replica or parity
  long long steps_done = -1;
  run.wait_line({}, "the kill's moment", [&](int i, const std::string& l) {
    if (bench::has(l, "serves the rendezvous store")) run.host_ = i;
    if (name == "replica" && bench::has(l, "holding replicas of node")) covered[i] = true;
    if (name == "ec" && bench::has(l, "holding parity fragment")) covered[i] = true;
    if (const long long st = step_line(l); st >= 0) steps_done = std::max(steps_done, st + 1);
    if (const size_t at = l.find("snapshot.every auto: a snapshot every "); at != std::string::npos)
      s.every = std::atoll(l.c_str() + at + 38);
    if (!s.live() && l.rfind("[rank 0] checkpoint: step ", 0) == 0 &&
        std::atoll(l.c_str() + 26) == kKillDone && bench::has(l, " saved to ")) {
      if (size_t a = l.rfind('('); a != std::string::npos) s.saved = l.substr(a + 1, l.size() - a - 2);
      return true;
    }
    return s.live() && s.every > 0 && int(covered.size()) == kNodes && steps_done >= kKillDone;
  });
  // The victim: the last node that neither hosts the store nor leads.
  for (int i = 0; i < kNodes; ++i)
    if (i != run.host_ && run.index_[size_t(i)] > 0 &&
        (run.victim_ < 0 || run.index_[size_t(i)] > run.index_[size_t(run.victim_)]))
      run.victim_ = i;
  if (run.victim_ < 0) throw IoError(label + ": no node to kill: every node hosts the store or leads");
  s.victim_node = run.index_[size_t(run.victim_)];
  std::vector<std::pair<int, pid_t>> kept;  // (agent, worker) of the survivors
  for (int i = 0; i < kNodes; ++i)
    if (i != run.victim_) kept.push_back({i, worker_child(run.agents_[size_t(i)]->pid())});
  if (!s.live()) {
    for (const auto& e : fs::recursive_directory_iterator(run.folder() / "checkpoints"))
      if (e.is_regular_file()) drop_cache(e.path());
    s.cached = cached_share(run.folder() / "checkpoints");
  }
  const std::vector<size_t> from = run.marks();
  const pid_t agent = run.agents_[size_t(run.victim_)]->pid();
  const std::vector<pid_t> kids = child_pids(agent);  // its worker and its snapshot agent
  s.t_kill = run.now();
  run.agents_[size_t(run.victim_)]->kill();
  for (pid_t k : kids) ::kill(k, SIGKILL);
  progress(str(label, ": killed node ", s.victim_node, " (weft run pid ", agent, " and its ",
               kids.size(), " children)"));
  auto d = run.wait_line(from, "detection", [&](int i, const std::string& l) {
    return i != run.victim_ && bench::has(l, "weft run: membership changed");
  });
  s.t_detect = d.second.t;
  s.detect_line = d.second.text;
  if (s.live()) {
    auto r = run.wait_line(from, "the resize line", [&](int, const std::string& l) {
      return l.rfind("[rank 0] resize: ", 0) == 0 && bench::has(l, "world 3 -> 2");
    });
    if (!parse_resize(r.second.text, s))
      throw IoError(str(label, ": the survivors did not resume from the snapshots: ", r.second.text));
    s.t_ready = r.second.t;
    auto f = run.wait_line(from, "the new world's first step", [&](int, const std::string& l) {
      return step_line(l) >= 0 && bench::has(l, " world 2 after a resize of ");
    });
    s.t_first = f.second.t;
    if (name == "ec")
      for (int i = 0; i < kNodes; ++i)
        for (size_t k = from[size_t(i)]; k < run.agents_[size_t(i)]->lines().size(); ++k)
          if (const StampedLine& x = run.agents_[size_t(i)]->lines()[k];
              bench::has(x.text, "rebuilt node ")) {
            parse_rebuild(x.text, s);
            s.t_rebuild_end = x.t;
          } else if (bench::has(x.text, " is lost: rebuilding its ")) {
            s.t_rebuild_begin = x.t;
          }
    s.kept = std::all_of(kept.begin(), kept.end(), [&](const auto& p) {
      return p.second > 0 && worker_child(run.agents_[size_t(p.first)]->pid()) == p.second;
    });
  } else {
    std::vector<BenchAgent*> survivors;
    std::vector<size_t> at;
    for (int i = 0; i < kNodes; ++i)
      if (i != run.victim_) survivors.push_back(run.agents_[size_t(i)].get()), at.push_back(from[size_t(i)]);
    for (;;) {
      s.ph = bench::find_phases(survivors, at);
      if (s.ph.started_over)
        throw IoError(label + ": the new world started over from step 0: no checkpoint resumed\n" +
                      run.tails());
      if (s.ph.complete()) break;
      run.wait_line(run.marks(), "the restarted world's first step",
                    [](int, const std::string&) { return true; });  // one more line
    }
    s.t_detect = s.ph.detect->t;
    s.t_ready = s.ph.load->t;
    s.t_first = s.ph.first_step->t;
    s.resumed = s.ph.resumed_step;
  }
  // The new world's next step: what a step of this world costs once its first is done.
  const long long first_no = s.live() ? s.resumed : s.ph.first_step_no;
  auto n = run.wait_line(from, "the new world's second step", [&](int, const std::string& l) {
    return first_no >= 0 && step_line(l) == first_no + 1;
  });
  s.t_second = n.second.t;
  progress(str(label, ": ready ", std::lround(1e3 * s.ready()), " ms and first step ",
               std::lround(1e3 * s.total()), " ms after the failure was known"));
  return s;
}

std::string secs(double x) {
  if (x < 0) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.3f", x);
  return b;
}

void print_table(const JobShape& j, const std::string& note, const std::vector<Side>& sides) {
  const Side& ck = sides.back();
  std::printf(
      "== node-loss: %s: a node lost whole (weft run, its worker and its snapshot agent "
      "SIGKILLed) after %d steps; %d nodes x 1 rank on 127.0.0.1, ZeRO-3 (the lost shard exists "
      "nowhere else alive)\n",
      j.name == "S" ? "config S" : (j.name + " state").c_str(), kKillDone, kNodes);
  std::printf("  %s\n", j.describe().c_str());
  if (!note.empty()) std::printf("  %s\n", note.c_str());
  for (const Side& s : sides) {
    if (s.live())
      std::printf(
          "  %s: elastic.on_change reshard, snapshot.every auto (chose %lld), snapshot.redundancy "
          "%s; resumed at step %lld (%lld back) from snapshots (%s), %.2f MiB between ranks; "
          "survivors' worker processes %s\n",
          s.name.c_str(), s.every, s.name.c_str(), s.resumed, s.back, s.origins.c_str(), s.mib,
          s.kept ? "kept" : "NOT kept");
    else
      std::printf(
          "  checkpoint: elastic.on_change restart, checkpoint.every %d, saved right before the "
          "kill (%s), its page cache dropped (%.1f%% still cached); resumed at step %lld\n",
          kKillDone, s.saved.c_str(), s.cached < 0 ? 0.0 : 100 * s.cached, s.resumed);
  }
  std::printf("  detection: \"%s\"\n", ck.detect_line.c_str());
  std::printf("%-22s |", "phase");
  for (const Side& s : sides) std::printf(" %10s s |", s.name.c_str());
  std::printf(" ends when\n");
  auto row = [&](const char* name, auto value, const char* when) {
    std::printf("%-22s |", name);
    for (const Side& s : sides) std::printf(" %12s |", value(s).c_str());
    std::printf(" %s\n", when);
  };
  row("detect", [](const Side& s) { return secs(s.t_detect - s.t_kill); },
      "the first survivor's agent names the change (from the SIGKILL; not in the totals)");
  row("  membership", [](const Side& s) { return s.live() ? secs(s.membership) : "-"; },
      "live: the new epoch agreed (the resize line's phases, as the new rank 0 timed them)");
  row("  communicators", [](const Side& s) { return s.live() ? secs(s.comms) : "-"; },
      "live: new world connected, snapshots listed (an ec rebuild finishes within it)");
  row("    fetch + decode", [](const Side& s) {
        return s.name == "ec" ? secs(s.fetch_decode_ms / 1e3) : s.name == "replica" ? "0" : "-";
      },
      "ec: the next node's agent fetches K fragments per stripe and decodes; replica: pushed "
      "before the failure");
  row("    rebuild begins", [](const Side& s) {
        return s.t_rebuild_begin < 0 ? "-" : secs(s.t_rebuild_begin - s.t_detect);
      },
      "ec: from the failure known to the rebuilding agent's \"is lost: rebuilding\" (the new "
      "epoch's ring reached it)");
  row("    rebuild ends", [](const Side& s) {
        return s.t_rebuild_end < 0 ? "-" : secs(s.t_rebuild_end - s.t_detect);
      },
      "ec: from the failure known to its \"rebuilt node\" line (the new world's list waits "
      "for it)");
  row("  plan", [](const Side& s) { return s.live() ? secs(s.plan) : "-"; },
      "live: holders chosen, trainer built, transfer planned");
  row("  read snapshots", [](const Side& s) { return s.live() ? secs(s.read) : "-"; },
      "live: the chosen slots mapped in and verified in place (crc32c), not copied: the "
      "router reads them");
  row("  transfer", [](const Side& s) { return s.live() ? secs(s.transfer) : "-"; },
      "live: the router moves what another rank holds");
  row("  rendezvous", [](const Side& s) {
        return s.live() ? "-" : secs(s.ph.rendezvous->t - s.ph.detect->t);
      },
      "checkpoint: every survivor is a node of the new epoch");
  row("  restart", [](const Side& s) {
        return s.live() ? "-" : secs(s.ph.restart->t - s.ph.rendezvous->t);
      },
      "checkpoint: the new rank 0's first line (processes started, model built)");
  row("  load", [](const Side& s) { return s.live() ? "-" : secs(s.ph.load->t - s.ph.restart->t); },
      "checkpoint: \"checkpoint: resumed from\" (the disk read, resharded to the new world)");
  row("ready", [](const Side& s) { return secs(s.ready()); },
      "from the failure known to ready to step (live: the resize line's arrival)");
  row("first step", [](const Side& s) { return secs(s.t_first - s.t_ready); },
      "the new world's first step logged");
  row("total", [](const Side& s) { return secs(s.total()); },
      "from the failure known to the first step");
  row(
      "second step", [](const Side& s) { return secs(s.t_second - s.t_first); },
      "the new world's next step: a step of the same world, the first step's yardstick");
  for (const Side& s : sides) {
    if (!s.live()) continue;
    const double rr = ck.ready() / s.ready(), rt = ck.total() / s.total();
    std::printf(
        "ratio checkpoint / %s: %.1fx to ready, %.1fx to the first step; target: recovery >= "
        "%.0fx faster than the disk restart: %s (to ready)\n",
        s.name.c_str(), rr, rt, kTarget, rr >= kTarget ? "met" : "NOT met");
  }
  for (const Side& s : sides)
    if (s.name == "ec" && s.rebuild_ms >= 0)
      std::printf(
          "  ec rebuild (the agent's line): %.2f MiB in %.1f ms (asking the holders %.1f ms, "
          "fetch and decode %.1f ms%s%s)\n",
          s.rebuilt_mib, s.rebuild_ms, s.ask_ms, s.fetch_decode_ms,
          s.rebuild_parts.empty() ? "" : ": ", s.rebuild_parts.c_str());
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace

void run_node_loss(const Options& o) {
  const std::string token = comm::auth::generate_token();
  ::setenv("WEFT_JOB_TOKEN", token.c_str(), 1);  // the agents' authenticated transport
  for (const std::string& name : o.configs) {
    std::string note;
    const JobShape j = make_node_shape(name, o, &note);
    std::vector<Side> sides;
    for (const char* side : {"replica", "ec", "checkpoint"}) sides.push_back(run_side(o, j, side));
    print_table(j, note, sides);
  }
}

}  // namespace weft::launch::snapbench
