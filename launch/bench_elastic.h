// `weft bench elastic`: the downtime of elasticity, with `weft run` agents on loopback.
// --mode restart (the baseline): N agents train one job (by default ~350M parameters with
// Adam, configs/bench-elastic-350m.yaml); right after the first checkpoint one node's agent is
// killed (SIGKILL), and the time from its death to the first step of the new world is split
// into detect / rendezvous / restart / load / first step. --mode reshard: one live job
// (elastic.on_change: reshard) through two graceful leaves (dp4 -> dp2), two joins (-> dp4) and
// a failure (-> dp3); each change's downtime, the resize line's phases and the bytes moved.
// --mode both: the same job and changes under on_change: restart first, then side by side
// (launch/bench_elastic_planned.h). Times come from the agents' output lines, stamped on
// arrival (steady clock).
#pragma once

#include <string>
#include <vector>

namespace weft::launch {

// Runs the benchmark (see its --help) and prints the table; returns the exit code: 0 when
// every phase of every change was seen, 1 when the job failed or a phase did not come within
// --timeout. ConfigError for bad options or a model that does not fit this machine's memory.
int run_elastic_bench(const std::vector<std::string>& args);

}  // namespace weft::launch
