// weft run's side of the node's snapshot agent (launch/snapshot_agent.h): whether a job
// needs one, and the agent process beside the workers: started before them, restarted
// when it dies while the job runs, told to `finish` when the job ends well (its segments
// are removed) and stopped with SIGTERM when it does not (they stay for a restart). With
// snapshot.redundancy: replica it also listens for the other nodes' agents (--listen), and
// weft run tells it each epoch's peers (node_agent.cc publishes the endpoints in the store).
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace weft::launch {

struct SnapshotAgentPlan {
  std::string job_id;  // checkpoint::job_id_for_run(run id): the workers' job id too
  // The index the agent is named by on this machine (its lock and socket): the one wanted
  // (the node's place; MAX for a spare, which has none yet) unless a live agent of the job
  // holds it here, else the first free from max(node + 1, nnodes_max). A name held is another
  // node's agent on the same machine: a spare's guessed place is a member's, and a newcomer's
  // rank (so its index) may be that of a departing node still handing over. A name is only a
  // name: the node's real place comes with each epoch (peers). SnapshotAgentProcess's start
  // chooses it by taking its lock (checkpoint::take_agent_lock), then sets node and socket.
  int node = 0;
  int nnodes_max = 1;               // --nnodes MAX: the first index beyond any member's
  std::string socket;               // checkpoint::agent_socket_path(job id, node)
  std::string redundancy = "none";  // snapshot.redundancy: "none" = this node's only copy
  int ec_k = 2, ec_m = 1;           // snapshot.ec (redundancy ec)
  std::string listen;     // replica, ec: "host:0", where the other nodes' agents reach this one
  bool insecure = false;  // --rdzv-conf insecure without a token: peers from anywhere
};

// What weft run knows of the job's nodes when it starts the agent.
struct SnapshotAgentSite {
  std::string host;    // this node's address toward the others ("" for --standalone)
  int nnodes_max = 1;  // --nnodes MAX
  bool insecure = false;
};

// The agent the workers of `command` need, or nullopt: the command is `weft train` (its
// first word's file name is weft) and its job file (--config, with the --set overrides
// applied by core/config's loader) has snapshot.every > 0. A command whose arguments or
// job file cannot be read gives nullopt: the worker reports that error itself.
std::optional<SnapshotAgentPlan> snapshot_agent_plan(const std::vector<std::string>& command,
                                                     const std::string& run_id, int node);

// One agent process. Not thread-safe: weft run's main thread only (the agent's parent-death
// signal follows the thread that forked it).
class SnapshotAgentProcess {
 public:
  // Chooses the agent's index (plan.node: the first whose lock it takes, SnapshotAgentPlan
  // says which) and starts `weft snapshot-agent` (this binary) under it, handing it the lock
  // taken (--lock-fd: no other weft run can take that index between the choice and the
  // agent's start; this process keeps no copy, so a killed agent's lock is free), in its own
  // process group, with SIGTERM as its parent-death signal (it keeps the segments) and this
  // process as its guardian (--guardian: recorded in its segments, which stay while a
  // restart is due); sets WEFT_SNAPSHOT_SOCKET in this process's environment for the
  // workers, and waits until it answers. IoError when it exits or does not answer within 10 s.
  explicit SnapshotAgentProcess(SnapshotAgentPlan plan);
  ~SnapshotAgentProcess();  // stop() unless finished; never throws
  SnapshotAgentProcess(const SnapshotAgentProcess&) = delete;
  SnapshotAgentProcess& operator=(const SnapshotAgentProcess&) = delete;

  // Reaps the agent if it ended and starts it again under the same index (its lock taken
  // again and handed over; it adopts its segments), saying so on stderr; after three deaths
  // within 2 s of their start it gives up (said once). Cheap when it runs: call it at every
  // monitor tick.
  void keep_alive();
  // The job ended well: `finish` (the agent removes the job's segments and exits 0), reaped.
  void finish() { end_well(false); }
  // This node left a job that goes on, its hand-over confirmed: `finish` of the node's scope
  // (the agent removes the segments it holds, the others' on this machine stay, and exits
  // 0), reaped. Its snapshots are of no use to anyone once the others hold its state.
  void leave() { end_well(true); }
  // The job failed or was stopped: SIGTERM, SIGKILL after 5 s, reaped; segments stay.
  // The socket and lock a killed agent left are removed (checkpoint/snapshot_agent_files.h).
  void stop();

  const SnapshotAgentPlan& plan() const { return plan_; }
  pid_t pid() const { return pid_; }
  // Counts the agent's starts: a new one has a new endpoint and knows no peers.
  int generation() const { return generation_; }
  // Where the running agent accepts its peers ("host:port"; "" without plan().listen, or
  // when it does not answer within 2 s). Asked once per start.
  std::string endpoint();
  // Tells the running agent the ring of `epoch`; IoError when it cannot be told.
  void peers(int64_t epoch, int node, const std::vector<std::string>& nodes);

 private:
  int choose_index();  // plan_.node and plan_.socket; the lock taken (a descriptor)
  void end_well(bool node_only);
  void spawn(int lock = -1);  // -1: takes plan_.node's lock first (a restart)
  bool wait_ready(double seconds);
  bool reap(bool block);  // true once the agent is reaped (pid_ = -1)
  SnapshotAgentPlan plan_;
  pid_t pid_ = -1;
  double started_s_ = 0;
  int quick_deaths_ = 0;
  bool given_up_ = false;
  int generation_ = 0;
  int endpoint_of_ = -1;  // the generation endpoint_ was asked of
  std::string endpoint_;
};

// weft run's entry point: the agent for `command` when it needs one (snapshot_agent_plan),
// started under `node` or the first free index from `site.nnodes_max` up; nullptr otherwise.
// ConfigError naming snapshot.redundancy for replica on a job of one node (`site.nnodes_max`
// < 2: --standalone, --nnodes 1): nobody to copy to; naming snapshot.ec for ec on fewer than
// k + m nodes.
std::unique_ptr<SnapshotAgentProcess> start_snapshot_agent(const std::vector<std::string>& command,
                                                           const std::string& run_id, int node,
                                                           const SnapshotAgentSite& site = {});

}  // namespace weft::launch
