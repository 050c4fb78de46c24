// The tables of `weft bench elastic --mode reshard|both` (launch/bench_elastic_planned.h):
// downtime side by side in two measures, where each change's time went on each side, and the
// live side's resize phases and bytes.
#include <algorithm>
#include <cstdio>
#include <string>

#include "base/check.h"
#include "launch/bench_elastic_planned.h"
#include "launch/bench_util.h"

namespace weft::launch::bench {

std::string fixed3(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3f", x);
  return b;
}

namespace {

std::string ratio(double base, double ours) {
  if (!(ours > 0) || base < 0) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.1fx", base / ours);
  return b;
}

const Change* named(const SideResult* s, const std::string& name) {
  if (!s) return nullptr;
  for (const Change& c : s->changes)
    if (c.name == name) return &c;
  return nullptr;
}

// "SIGTERM +0.000, agent leaves +0.004, ..., first step +9.812": the path from the notice,
// in order of arrival, with the old world's last step among it.
std::string path_of(const Change& c) {
  auto p = c.path;
  p.push_back({str("last old step (", c.last_step_no, ")"), c.last_step});
  std::stable_sort(p.begin(), p.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  std::string out;
  for (const auto& [what, t] : p) {
    char b[32];
    std::snprintf(b, sizeof b, " %+.3f", t - c.notice);
    out += (out.empty() ? "" : ",") + std::string(" ") + what + b;
  }
  return out;
}

// Where a live change's state came from when not (only) from the survivors: "; state from
// in-memory snapshots (1 own, 2 replicas) of step 12, 3 steps back".
std::string source_of(const Change& c) {
  if (c.source == "survivors") return "";
  return str("; state from ", c.source == "snapshots" ? "in-memory snapshots (" + c.origins + ")"
                                                       : std::string("the latest checkpoint"),
             " of step ", c.resumed_step, ", ", c.went_back, c.went_back == 1 ? " step" : " steps",
             " back");
}

std::string format(const char* f, double x) {
  char b[64];
  std::snprintf(b, sizeof b, f, x);
  return b;
}

}  // namespace

void print_planned(const Options& o, const SideResult& live, const SideResult* restart) {
  const double replica_mib = 12 * o.params / (1024.0 * 1024.0);  // f32 weights, Adam's m and v
  const core::ParallelSpec& par = o.spec.parallel;
  const bool replicas = par.zero == 0 && par.tp == 1 && par.pp == 1 && par.ep == 1;
  std::printf(
      "\ndowntime in seconds. notice -> 1st step: from the change known (leave: the SIGTERM; "
      "join: the members'\nnotice; failure: its detection) to the new world's first step "
      "logged (the issue's downtime; the ratio\nrestart / reshard of the targets). no rank "
      "trains: from the old world's last step logged to the new\nworld ready (reshard: the "
      "resize line; restart: \"checkpoint: resumed\").\n");
  std::printf("%-8s | %-6s | %9s | %9s | %7s | %9s | %9s | %7s | %s\n", "downtime", "world",
              "reshard", "restart", "ratio", "reshard", "restart", "ratio", "change");
  std::printf("%-8s | %-6s | %29s | %29s |\n", "", "", "notice -> 1st step      ",
              "no rank trains         ");
  for (const Change& c : live.changes) {
    const Change* r = named(restart, c.name);
    std::printf("%-8s | %d -> %d | %9.3f | %9s | %7s | %9.3f | %9s | %7s | %s%s\n", c.name.c_str(),
                c.from, c.to, c.from_notice(), r ? fixed3(r->from_notice()).c_str() : "-",
                r ? ratio(r->from_notice(), c.from_notice()).c_str() : "-", c.idle(),
                r ? fixed3(r->idle()).c_str() : "-", r ? ratio(r->idle(), c.idle()).c_str() : "-",
                c.what.c_str(), source_of(c).c_str());
  }
  for (const Change& c : live.changes) {
    const Change* r = named(restart, c.name);
    if (c.name == "failure")
      std::printf("failure: the kill -> its detection (not in the downtime): reshard %.3f s%s\n",
                  c.notice - c.cause, r ? str(", restart ", fixed3(r->notice - r->cause), " s").c_str() : "");
    if (c.name == "join")
      std::printf("join: the joiners' start -> the members' notice (not in the downtime): reshard "
                  "%.3f s%s\n",
                  c.notice - c.cause, r ? str(", restart ", fixed3(r->notice - r->cause), " s").c_str() : "");
  }
  {
    std::string codes, spans, stuck;
    for (int x : live.leaver_codes) codes += (codes.empty() ? "" : ", ") + std::to_string(x);
    for (const Change& c : live.changes)
      if (c.name.rfind("leave", 0) == 0) spans += str(spans.empty() ? "" : ", ", c.name, " ", c.epochs);
    for (const std::string& x : live.stuck) stuck += (stuck.empty() ? "" : ", ") + x;
    const bool running = std::count(live.leaver_codes.begin(), live.leaver_codes.end(), -1) > 0;
    std::printf("leaves: epochs per resize %s; the leaving agents exited with %s%s%s\n",
                spans.c_str(), codes.c_str(), running ? " (-1: still running 10 s after the rest)" : "",
                stuck.empty() ? ""
                              : str("; never handed over: ", stuck,
                                    " (its departure's epoch was replaced by the other leave's "
                                    "before its workers were told)").c_str());
  }
  std::printf(
      "targets (issue 14, not asserted): restart / reshard at least 30x on every change, 100x "
      "where no bytes move (the leaves)\n");

  std::printf("\nwhere the time went, seconds from the notice (stamped on arrival here):\n");
  for (const SideResult* s : {&live, restart}) {
    if (!s) continue;
    for (const Change& c : s->changes) {
      std::printf("  %s %s:%s", s == &live ? "reshard" : "restart", c.name.c_str(),
                  path_of(c).c_str());
      if (s == &live)
        std::printf("%s", source_of(c).c_str());
      else if (c.resumed_step >= 0)
        std::printf("; resumed at step %lld after step %lld (%lld redone)", c.resumed_step,
                    c.last_step_no, std::max(0LL, c.last_step_no + 1 - c.resumed_step));
      std::printf("\n");
    }
  }

  // "read snapshots" is a column of its own once a change read any (a loss of state only
  // snapshots held, however short the read); a job that never reads them keeps the table
  // as it was.
  bool read = false;
  for (const Change& c : live.changes) read = read || c.read > 0 || c.source == "snapshots";
  std::printf("\n%-8s | %10s | %11s | %5s |%s %8s | %6s | %6s | %s\n", "phases", "membership",
              "communicators", "plan", read ? " read snapshots |" : "", "transfer", "resume",
              "total", "reshard, as the new rank 0 saw it (the change known -> ready to step)");
  for (const Change& c : live.changes)
    std::printf("%-8s | %10.2f | %11.2f | %5.2f |%s %8.2f | %6.2f | %6.2f | %s\n", c.name.c_str(),
                c.membership, c.communicators, c.plan,
                read ? format(" %14.2f |", c.read).c_str() : "",
                c.transfer, c.resume, c.again,
                c.comms_ahead ? "communicator connected while the old world ended its step"
                              : "communicator connected in the entry");
  std::printf("\n%-8s | %7s | %12s | %12s | %9s | %11s | %6s | %8s | %12s | %s\n", "bytes",
              "holders", "MiB between", "MiB minimum", "MiB kept", "MiB copied", "GB/s",
              "x memcpy", "all ranks in", "peak RSS per live worker (VmHWM, GiB)");
  for (const Change& c : live.changes) {
    std::string hwm;
    for (double g : c.hwm_gib) hwm += (hwm.empty() ? "" : " ") + fixed3(g).substr(0, fixed3(g).size() - 1);
    // The minimum of full replicas only (dp alone, zero 0); another layout's needs the plans.
    const double min = c.to > c.from ? (c.to - c.from) * replica_mib : 0;
    char mins[32] = "-";
    if (replicas) std::snprintf(mins, sizeof mins, "%.1f", min);
    // From snapshots the resize line counts the bytes between ranks only.
    const bool survivors = c.source == "survivors";
    // Bytes between ranks over rank 0's transfer phase (waiting for the slowest rank to get
    // there included), against one thread's memcpy; "all ranks in": over the same phase less
    // that wait (the resize line's "until the last rank reached the move"), the rate of the
    // bytes once every rank moves them. The wait itself is another rank's reserve.
    const double bps =
        c.mib_between > 0 && c.transfer > 0 ? c.mib_between * 1048576 / c.transfer : 0;
    const double moving = c.transfer - c.transfer_wait;
    const double bps_in = c.mib_between > 0 && moving > 0 ? c.mib_between * 1048576 / moving : 0;
    auto ratio = [&](double b) {
      return b > 0 && o.memcpy_bps > 0 ? format("%.2gx", b / o.memcpy_bps) : std::string("-");
    };
    std::printf("%-8s | %7d | %12.1f | %12s | %9s | %11s | %6s | %8s | %12s | %s\n",
                c.name.c_str(), c.holders, c.mib_between, mins,
                survivors ? format("%.1f", c.mib_kept).c_str() : "-",
                survivors ? format("%.1f", c.mib_copied).c_str() : "-",
                bps > 0 ? format("%.3g", bps / 1e9).c_str() : "-", ratio(bps).c_str(),
                ratio(bps_in).c_str(), hwm.c_str());
  }
  if (replicas)
    std::printf(
      "minimum: a DP shrink or loss moves nothing (every survivor holds a full replica); each "
      "newcomer needs one\nreplica, 12 B/parameter (f32 weights, Adam's m and v) = %.1f MiB.\n",
      replica_mib);
  if (!live.steps_before.empty() && !live.steps_after.empty()) {
    const double before = median(live.steps_before), after = median(live.steps_after);
    std::printf(
        "\nsnapshots' cost on the live side, rank 0's steady step in the first world (world 4): "
        "%.0f ms before its\nfirst snapshot (median of %zu steps, the world's first and the "
        "probe's left out), %.0f ms after it (median of %zu,\nat the interval auto chose): "
        "%+.1f%%\n",
        before, live.steps_before.size(), after, live.steps_after.size(),
        before > 0 ? 100 * (after / before - 1) : 0.0);
  }
  for (const std::string& l : live.auto_lines)  // one per world, in order
    std::printf("  %s\n", l.substr(l.find("snapshot.every auto: ")).c_str());
}

}  // namespace weft::launch::bench
