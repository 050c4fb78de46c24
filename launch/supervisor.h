// The agent side of `weft run`, one attempt: starts the workers (worker_spawn.h), routes
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
  int nnodes_min = 1, nnodes_max = 1;  // --nnodes MIN:MAX (WEFT_NNODES)
  std::string store_prefix;  // WEFT_STORE_PREFIX of the workers' keys; "" = none
  // Called on the agent's thread about every monitor_interval_s while workers run (and for
  // up to settle_s after they failed of a peer's loss): a non-empty return says why the
  // job must stop because of another node (lost, or failed); it then stops the workers and
  // takes that as the root cause. Must not throw.
  std::function<std::string()> monitor;
  // Called when `monitor` returned a verdict: true when it is a loss (a member of the
  // workers' world gone, or a peer's worker failed): no step of theirs can end then (its
  // collectives wait on the lost one), so the graceful stop (SIGTERM: end the step, save a
  // checkpoint) would only wait out grace_s; they are SIGKILLed at once instead. False or
  // unset (a node joined, the job closed): SIGTERM and the grace. Must not throw.
  std::function<bool()> verdict_is_loss;
  double monitor_interval_s = 0.1;
  // Readable when `monitor` should look now rather than at its next interval (the
  // membership record changed: membership_wake.h); -1: none. The supervisor drains it (an
  // eventfd) and runs one monitor pass at once.
  int wake_fd = -1;
  // How long the agent waits for worker output, heartbeats or exits before it looks again
  // (signals, deadlines): --monitor-interval with --standalone; 20 ms by default.
  double poll_s = 0.02;
  double settle_s = 0;
  // Restarts (torchrun's TORCHELASTIC_RESTART_COUNT / _MAX_RESTARTS): which attempt this
  // is; logs and error files go to <log dir>/attempt_<restart_count>/rank_<r>/.
  int restart_count = 0, max_restarts = 0;
  // The membership epoch the workers run in (WEFT_RDZV_EPOCH; metrics lines carry it).
  int64_t rdzv_epoch = 0;
  // Called on the agent's thread at its first SIGTERM: true when the agent handles it
  // itself (a node leaving a live job gracefully: its workers hand their state over and
  // end on their own), so the supervisor does not stop the workers for it. Must not throw.
  std::function<bool()> on_terminate;
  // Where the agent posts later epochs to running workers (WEFT_EPOCH_FILE,
  // epoch_notice.h); "" = workers get no notices and are restarted on a change.
  std::string epoch_file;
  // In-place replacement (elastic, live workers): called on the agent's thread when the
  // worker of `local_rank` failed of its own (it exited non-zero or was killed, not stopped
  // by the agent) or hung (no heartbeat for heartbeat_timeout_s: the supervisor SIGKILLs its
  // group and asks once it has reaped it) while nothing else stops the attempt. `cause` is
  // one line naming it. True: the agent has published the epoch its replacement joins and
  // updated these options for it (store_prefix, rdzv_epoch, restart_count, node_index,
  // nnodes, the store's address); the supervisor starts a new worker in that slot (logs
  // under attempt_<restart_count>), says which epoch it joins, and leaves the others
  // running. So supervise() must be given the very options object that `replace` updates
  // (it reads them again for the replacement). False: the attempt fails as before, the
  // others are stopped. Must not throw.
  std::function<bool(int local_rank, const std::string& cause)> replace;
};

// How one attempt ended.
struct Outcome {
  enum class End {
    kSucceeded,  // every worker exited 0
    kFailed,     // a worker here failed (or hung): `cause` is the root-cause line
    kStopped,    // `monitor` stopped the workers: `cause` is its verdict
    kSignalled,  // the agent got SIGINT/SIGTERM/SIGHUP and stopped the workers
  };
  End end = End::kSucceeded;
  // weft run's exit code if the job ends with this attempt: 0; the root-cause worker's exit
  // code (1 when it was killed or hung, 2 for bad input); 1 when `monitor` stopped it; 128 +
  // the signal that stopped the agent (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP).
  int code = 0;
  std::string cause;    // one line: "rank 3 (pid 7, host h) failed: ..." or the verdict
  std::string verdict;  // kFailed/kStopped: what `weft run: failed: ` should be followed by
};

// Runs one attempt of the job: starts the workers, watches them to their end (printing the
// root-cause summary when one failed) and returns how it ended. Must be called from the
// main thread (a worker's parent-death signal follows the thread that forked it).
// Signals received before the call (and not yet acted on) stop this attempt at once.
Outcome supervise(const SupervisorOptions& o);

// True once the agent got SIGINT, SIGTERM or SIGHUP (the handlers are installed by the
// first supervise()): the restart loop must not start another attempt.
bool stop_requested();

}  // namespace weft::launch
