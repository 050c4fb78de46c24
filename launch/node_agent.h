// One node's elastic agent in a multi-node `weft run` (--rdzv-endpoint): joins the
// membership (comm/elastic), runs attempts of the job through the supervisor, and between
// attempts restarts them torchrun's way:
//
//   - a worker failed here, with restarts left, and the workers reshard live
//     (elastic.on_change: reshard): the agent replaces it in place (a new worker in its
//     slot, the epoch renewed with the same nodes; nobody else restarts);
//   - a worker failed here, with restarts left, workers that do not: the agent asks for the
//     job's next restart round (a field of the membership record, Rendezvous::ask_round) so
//     that every node stops its workers, and all start the next attempt in the same epoch
//     from the latest checkpoint;
//   - the membership changed (a node lost, one joined or admitted from the spares, within
//     --nnodes MIN:MAX): every node stops its workers and starts them for the new world;
//   - anything else ends the job here: restarts used up, the job closed by another node,
//     this node in a minority partition (QuorumLostError), the store lost.
//
// Each attempt's workers bootstrap under rdzv/<id>/epoch/<E>/round/<R>, so keys of an
// earlier attempt never mix with a later one's; TORCHELASTIC_RESTART_COUNT is (E - 1) + R,
// the same on every node, newcomers included. --max-restarts bounds the restarts caused by
// failures (a worker failed, a node lost); a node joining does not use one (torchrun's rule).
//
// With a fixed --nnodes N and --max-restarts 0 nothing restarts: a lost node or a failed
// worker stops the job on every node at once, naming the cause.
#pragma once

#include "launch/run_options.h"
#include "launch/supervisor.h"

namespace weft::launch {

// Runs this node's part of the job to its end and returns weft run's exit code (the
// supervisor's codes; 1 for a lost quorum, a closed job or a lost store). `so` carries the
// worker settings; this fills in the node's place in each attempt. Main thread only.
int run_node_agent(const RunOptions& o, SupervisorOptions so);

}  // namespace weft::launch
