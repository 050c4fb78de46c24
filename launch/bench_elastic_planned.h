// `weft bench elastic --mode reshard|both`: the planned changes (two graceful leaves,
// two joins) and a failure, driven on one job per side: live (elastic.on_change: reshard) and
// checkpoint-restart (on_change: restart, where a graceful leave stops the whole job, as
// torchrun's does, and the remaining nodes are relaunched with --resume). What each side saw
// per change, and the tables that set them side by side (launch/bench_elastic_table.cc).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "launch/bench_elastic_parts.h"

namespace weft::launch::bench {

// One change on one side, as the bench saw it. Stamps are seconds on the bench's clock.
struct Change {
  std::string name;  // leave (--leaves together), leave-a and leave-b, join, failure
  std::string what;
  int from = 0, to = 0;
  double cause = 0;     // the SIGTERM, the joiners' start, or the SIGKILL
  double notice = 0;    // the change known: leave, the SIGTERM; join, the members' notice of it;
                        // failure, its detection (a survivor names the change)
  double last_step = 0; // the old world's last step line (rank 0 logs every step at its end)
  double ready = 0;     // live: the resize line; restart: "checkpoint: resumed from"
  double first = 0;     // the new world's first step line
  long long last_step_no = -1, resumed_step = -1;
  // The path from the notice, in order: (what, stamp). Printed as offsets from the notice.
  std::vector<std::pair<std::string, double>> path;
  // Live only: the resize line's phases and bytes, and the live workers' VmHWM after it.
  double again = 0, membership = 0, communicators = 0, plan = 0, read = 0, transfer = 0,
         resume = 0;
  // Of `transfer`, rank 0's wait until the last rank reached the move (the line's "of the
  // transfer, X s until the last rank reached the move"; 0 when it says nothing).
  double transfer_wait = 0;
  // Live only: where the new world's state came from (the resize line): "survivors",
  // "snapshots" (origins: "1 own, 2 replicas") or "checkpoint"; the steps it went back.
  std::string source = "survivors", origins;
  long long went_back = 0;
  long long epoch = 0;  // live: the new world's epoch
  bool comms_ahead = false;
  double mib_between = 0, mib_kept = 0, mib_copied = 0;
  int holders = 0;
  std::vector<double> hwm_gib;
  int epochs = 1;  // live: the epochs the resize spanned (its line's "epoch A -> B")

  double from_notice() const { return first - notice; }
  double idle() const { return ready - last_step; }  // no rank trains
};

// One side's run of the four-node job through the leaves (4 -> 2: 4 -> 3 -> 2 one at a time,
// or at once with Options::leaves "together"), join (2 -> 4) and failure (4 -> 3). Throws Error (with the agents' tails on stderr) when a change does not complete.
struct SideResult {
  std::vector<Change> changes;
  // Live with snapshots: rank 0's steady step times (ms) in the first world before its
  // first snapshot and after it, and rank 0's "snapshot.every auto: ..." line of each world.
  std::vector<double> steps_before, steps_after;
  std::vector<std::string> auto_lines;
  bool kept_workers = false;  // live: the two nodes that lived through all kept their workers
  std::vector<int> leaver_codes;   // the leaving agents' exit codes (-1: still running)
  std::vector<std::string> stuck;  // live: leaving agents that never said they handed over
};
SideResult run_side(Options& o, bool live);

// The tables: downtime side by side (restart may be empty: --mode reshard), where the time
// went, the live side's phases and bytes.
std::string fixed3(double x);
void print_planned(const Options& o, const SideResult& live, const SideResult* restart);

}  // namespace weft::launch::bench
