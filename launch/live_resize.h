// Online resize, the worker's side (elastic.on_change: reshard). When the membership changes
// the worker keeps its process: it ends its world at a step boundary (or when a collective
// fails because a member died), keeps views of its VPS state, waits for its agent's notice
// of the new epoch (epoch_notice.h), joins the new world and gets the new layout's state
// from whoever holds it. That last part is one mechanism for every case:
//
//   every rank of the new world reports what it holds (nothing for a newcomer; a rank whose
//   failed step wrote part of its state holds nothing either); the holders of the latest
//   step whose boxes cover the whole state are layout A (the old plan, its ranks renamed
//   into the new world); the new plan is layout B; the router moves A to B. Survivors keep
//   what they hold, replicas serve what the dead held, newcomers receive everything.
//
// When no such holders exist (the only copy of a TP, PP or ZeRO shard died with its rank),
// the state comes from the latest durable checkpoint under checkpoint.dir, and the job says
// how many steps it went back; with no checkpoint either, from the seed at step 0.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "core/config/job_spec.h"
#include "core/graph/graph.h"
#include "core/tensor.h"
#include "launch/epoch_notice.h"
#include "parallel/launch_env.h"
#include "parallel/router.h"
#include "parallel/vps.h"
#include "planner/plan_cache.h"

namespace weft::parallel {
class ParallelTrainer;
}

namespace weft::launch {

// What a worker keeps of its trainer when its world ends.
struct HeldState {
  bool valid = false;  // false: nothing held (a newcomer), or a failed step wrote part of it
  int64_t epoch = 0;   // the membership epoch the state was trained in
  int rank = -1, world = 0;  // this worker's place in that epoch's world
  int64_t step = 0;          // the state is that before step `step` (current_step())
  std::vector<core::Tensor> tensors;  // layout_of(space, plan, rank).locals order (views)
};

// Views of `trainer`'s state (its storage outlives the trainer). `torn`: the last step
// failed after writing state on this rank (ParallelTrainer::torn()): nothing is held then.
HeldState hold_state(parallel::ParallelTrainer& trainer, const parallel::StateSpace& space,
                     int64_t epoch, bool torn);

// What a rank of the new world offers: its live state (source kLive, one per rank, valid or
// not) and the in-memory snapshots of its node's agent that it serves (any number; issue
// 15): a node's own (kSnapshot), a copy another node pushed (kReplica), or one rebuilt from
// parity (kRebuilt). `holder` is the offering rank of the new world.
struct HolderReport {
  static constexpr int64_t kLive = 0, kSnapshot = 1, kReplica = 2, kRebuilt = 3;
  int64_t valid = 0, epoch = 0, rank = -1, world = 0, step = 0, host = 0;
  int64_t holder = -1, source = kLive;
  int64_t layout_hash = 0;  // a snapshot's: checkpoint::snapshot_layout_hash of its boxes
};

// Collective over the new world: every rank's live report, in rank order (entry r is rank
// r's), then every rank's `offers` (snapshots), in rank order. `host` identifies this rank's
// machine (host_key()); holder and host are filled in here.
std::vector<HolderReport> exchange_reports(comm::Communicator& world, const HeldState& held,
                                           int64_t host,
                                           const std::vector<HolderReport>& offers = {});

// Whether a committed snapshot of `held` (its epoch, old rank and step) is among the
// reports: the node's own, a replica or one rebuilt from parity. Then the router may take the
// only handles on the live state and free each source as soon as it has moved (the memory
// model of router.h: the old and the new state are never held whole at once), since an
// entry that fails midway (a newer epoch, a lost peer) leaves the next world that snapshot,
// of the same step: nothing is redone. Without one, the live state stays held until the world
// is entered, which is the only copy the next world could take it from.
bool snapshot_backs(const HeldState& held, const std::vector<HolderReport>& reports);

// This machine: its host name and network namespace (ranks in different namespaces of one
// machine stand for different hosts and never share memory in a transfer).
int64_t host_key();

// Dense host ids (first appearance order) of the hosts of the first `world` reports (the
// ranks' live reports): Layout::hosts.
std::vector<int> host_ids(const std::vector<HolderReport>& reports, int world);

// The holders a new world takes its state from: among the valid reports, grouped by (step,
// epoch), the latest step (then the latest epoch) whose boxes (the old plan of that epoch's
// world, each old rank under the new rank that offers it) cover every state tensor. A rank's
// live state is preferred to a snapshot of the same old rank; one new rank may offer several
// old ranks (a node's agent holds the snapshots of all its workers). `found` false when no
// group covers the state.
struct Holders {
  bool found = false;
  int64_t epoch = 0, step = 0;
  int old_world = 0;
  std::vector<int> new_rank_of;  // old rank -> new rank, -1 for a rank nobody holds
  std::vector<int> report_of;    // old rank -> the index of the report it comes from, or -1
  parallel::Layout old;          // the old world's layout (old ranks)
  parallel::Layout a;            // layout A over the new world
  int count() const;
  int snapshots = 0;    // old ranks that come from snapshots (any kind)
  int replicas = 0;     // of them, copies on another node than their own
  int rebuilt = 0;      // of them, rebuilt from parity
  std::string why_not;  // when not found: the first gap, for the log
};
// `world`: the new world's size (the first `world` reports are the ranks' live ones).
// `plans` gives the old worlds' plans (a survivor's is the one it trained with; each world
// size's layout is planner::fit_layout's).
Holders choose_holders(planner::PlanCache& plans, const parallel::StateSpace& space,
                       const std::vector<HolderReport>& reports, int world);

// The LaunchEnv of a worker of local rank `base.local_rank` in the notice's epoch: its world
// is the transition's (members, then the departing nodes' workers).
parallel::LaunchEnv env_in_epoch(const parallel::LaunchEnv& base, const EpochNotice& n);

// While a world trains: aborts its communicators as soon as the agent's notice says a
// member is gone, so collectives waiting on it fail now, not after the timeout. A joining
// node or a graceful change does not abort anything (the step boundary handles those).
class LossWatcher {
 public:
  // `any_newer`: abort on any later epoch, not only one that lost a member (while a world
  // is being entered: a newer epoch means some of its ranks will never come).
  // `ahead`: called on the watcher's thread, once per epoch, with a later epoch's notice
  // that lost nobody (a graceful leave, a node admitted), which the world finishes its step
  // for: its world can be built meanwhile (world_ahead.h). Must not throw.
  LossWatcher(const EpochWatch& watch, std::vector<comm::Communicator*> comms,
              bool any_newer = false, std::function<void(const EpochNotice&)> ahead = {});
  ~LossWatcher();  // stops and joins the thread
  LossWatcher(const LossWatcher&) = delete;
  LossWatcher& operator=(const LossWatcher&) = delete;

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Every rank's `stop` and `change` or-ed over the world, `snapshot_ready` and-ed and
// `interval` maxed, in one small all-reduce (the one the step loop already does for Ctrl-C):
// every rank stops, or moves to the next epoch, after the same step, takes an in-memory
// snapshot there only when every rank is ready for one (RankSnapshots::ready), and applies
// the same snapshot interval (snapshot.every: auto; 0 when no rank proposes one). Collective.
struct Agreed {
  bool stop = false, change = false, snapshot = false;
  int64_t interval = 0;
};
Agreed agree_at_step_end(comm::Communicator& world, bool stop, bool change, bool snapshot_ready,
                         int64_t interval = 0);

}  // namespace weft::launch
