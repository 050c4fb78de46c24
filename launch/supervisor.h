// The agent side of `weft run --standalone`: starts the workers (worker_spawn.h), routes
// their output (worker_output.h), watches their exits and heartbeats, stops the job on the
// first failure or on SIGTERM/SIGINT/SIGHUP (the signal to every worker's group, SIGKILL
// after the grace period), and names the root cause from the per-rank error files.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "launch/worker_output.h"

namespace weft::launch {

struct SupervisorOptions {
  int nproc = 1;
  std::vector<std::string> command;
  std::string store_host = "127.0.0.1";
  int store_port = 0;
  double grace_s = 5;
  double heartbeat_interval_s = 1;
  double heartbeat_timeout_s = 5;  // 0: not watched
  OutputOptions output;
  std::string run_id;
  std::string role = "default";  // ROLE_NAME
  // Several nodes: this node's dense rank among `nnodes` (GROUP_RANK); a worker's global
  // rank is node_index * nproc + its local rank, the world nnodes * nproc.
  int node_index = 0, nnodes = 1;
  std::string store_prefix;  // WEFT_STORE_PREFIX of the workers' keys; "" = none
  // Called on the agent's thread about every monitor_interval_s while workers run (and for
  // up to settle_s after they failed of a peer's loss): a non-empty return says why the
  // job must stop because of another node (lost, or failed); it then stops the workers and
  // takes that as the root cause. Must not throw.
  std::function<std::string()> monitor;
  double monitor_interval_s = 0.1;
  double settle_s = 0;
  // Called once when the job failed here (not by `monitor`, not by a signal), with the
  // root-cause line, so that the agent can tell the other nodes. Must not throw.
  std::function<void(const std::string&)> on_failure;
};

// Runs the job to its end and returns weft run's exit code: 0; the root-cause worker's
// exit code (1 when it was killed or hung); 128 + the signal that stopped the job (130
// for Ctrl-C, 143 SIGTERM, 129 SIGHUP); 1 when `monitor` stopped the job. Must be called from the
// main thread (a worker's parent-death signal follows the thread that forked it).
int supervise(const SupervisorOptions& o);

}  // namespace weft::launch
