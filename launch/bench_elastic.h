// `weft bench elastic --mode restart`: the restart baseline of elasticity. N weft run agents
// on loopback train one job (by default ~350M parameters with Adam, configs/
// bench-elastic-350m.yaml); right after the first checkpoint one node's agent is killed
// (SIGKILL), and the time from its death to the first step of the new world is split into
// detect / rendezvous / restart / load / first step, from the agents' and the new rank 0's
// output lines, stamped on arrival here (steady clock). Online resharding must beat it.
#pragma once

#include <string>
#include <vector>

namespace weft::launch {

// Runs the benchmark (see its --help) and prints the table; returns the exit code: 0 when
// every phase was seen, 1 when the job failed or a phase did not come within --timeout.
// ConfigError for bad options, a mode other than restart ("not yet"), or a model that does
// not fit this machine's memory.
int run_elastic_bench(const std::vector<std::string>& args);

}  // namespace weft::launch
