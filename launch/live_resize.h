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
#include <map>
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

// One part of what a worker holds: local tensors of rank `rank`'s layout in the plan of a
// world of `world` ranks (parallel::layout_of(space, plan(world)).ranks[rank]), all of them
// (`locals` empty) or those listed (ascending), with their tensors in that order. A listed
// local that `partial` has boxes of holds only those (a destination that a stopped move
// filled in part: parallel::Arrived): their `local` is the slot's index, as in `locals`.
struct HeldPiece {
  int rank = -1, world = 0;
  std::vector<int> locals;
  std::vector<core::Tensor> tensors;
  std::vector<parallel::StateBox> partial;
};

// What a worker keeps of the state when its world ends: its trainer's state (one whole
// piece), or, after a move that a newer epoch stopped midway (held_after_move), the old
// layout's tensors it had not yet freed and what had arrived of the new layout's (whole
// tensors, and the arrived boxes of partly filled ones): pieces of several layouts, of one
// step.
struct HeldState {
  bool valid = false;  // false: nothing held (a newcomer), or a failed step wrote part of it
  int64_t epoch = 0;   // the membership epoch the state was trained in (a move keeps it)
  int rank = -1, world = 0;  // this worker's place in the world it last trained in
  int64_t step = 0;          // the state is that before step `step` (current_step())
  std::vector<HeldPiece> pieces;
  // Step `step` stopped right before this rank's update (its statistics exchange failed) and
  // the rest of it needs no peer (ParallelTrainer::can_finish_step): the worker keeps that
  // trainer, and the next world's entry may finish the step here (roll_forward.h). -1: no.
  int64_t unfinished = -1;
  // The statistics records of step `records_step` as this rank's exchange got them
  // (ParallelTrainer::exchanged_values), for the ranks behind; -1 and empty: none.
  int64_t records_step = -1;
  std::vector<double> records;
  int64_t bytes() const;
};

// Views of `trainer`'s state (its storage outlives the trainer), whether its last step can be
// finished alone, and the statistics records it keeps. `torn`: the last step failed after
// writing state on this rank (ParallelTrainer::torn()): no state is held then. The trainer's
// world may be gone.
HeldState hold_state(parallel::ParallelTrainer& trainer, const parallel::StateSpace& space,
                     int64_t epoch, bool torn);

// What a rank of the new world offers: its live state (source kLive, one per rank, valid or
// not) and the in-memory snapshots of its node's agent that it serves (any number; issue
// 15): a node's own (kSnapshot), a copy another node pushed (kReplica), or one rebuilt from
// parity (kRebuilt). `holder` is the offering rank of the new world.
// A live report is one piece of a rank's HeldState (`piece`, its index there), of the old
// layout slot (world, rank); `locals` lists the piece's local tensors when it holds only
// some (a move stopped midway), empty when it holds them all; `partial` the boxes of its
// locals that it holds only in part (HeldPiece::partial), empty for none.
struct HolderReport {
  static constexpr int64_t kLive = 0, kSnapshot = 1, kReplica = 2, kRebuilt = 3;
  int64_t valid = 0, epoch = 0, rank = -1, world = 0, step = 0, host = 0;
  int64_t holder = -1, source = kLive;
  int64_t layout_hash = 0;  // a snapshot's: checkpoint::snapshot_layout_hash of its boxes
  int64_t piece = -1;       // a live report's: index into its holder's HeldState::pieces
  std::vector<int> locals;  // a live report's: the piece's locals, or empty for all of them
  std::vector<parallel::StateBox> partial;  // a live report's: boxes of partly held locals
  // A rank's first live report's: HeldState::unfinished and records_step (else -1).
  int64_t unfinished = -1, records_step = -1;
};

// Collective over the new world: every rank's first live report, in rank order (entry r is
// rank r's; an invalid one for a rank that holds nothing), then every rank's other pieces
// and its `offers` (snapshots), in rank order. `host` identifies this rank's machine
// (host_key()); holder, host and piece are filled in here. The pieces' `locals` lists travel
// and `partial` boxes travel in a second exchange, only when some rank holds a part of a
// layout slot.
std::vector<HolderReport> exchange_reports(comm::Communicator& world, const HeldState& held,
                                           int64_t host,
                                           const std::vector<HolderReport>& offers = {});

// Whether committed snapshots of every piece of `held` (its epoch, the piece's layout slot,
// its step) are among the reports: the node's own, replicas or rebuilt from parity. Then the
// state survives even a rank lost during the move (elastic.old_state: keep_unless_backed
// frees the old state as it moves only then).
bool snapshot_backs(const HeldState& held, const std::vector<HolderReport>& reports);

// This machine: its host name and network namespace (ranks in different namespaces of one
// machine stand for different hosts and never share memory in a transfer).
int64_t host_key();

// Dense host ids (first appearance order) of the hosts of the first `world` reports (the
// ranks' live reports): Layout::hosts.
std::vector<int> host_ids(const std::vector<HolderReport>& reports, int world);

// The holders a new world takes its state from: among the valid reports, grouped by (step,
// epoch), the latest step (then the latest epoch) whose boxes cover every state tensor. A
// group takes every live piece it has, whatever layout it is of (a move stopped midway
// leaves pieces of the old and of the new layout, of the same step), and a snapshot of each
// layout slot that no live piece holds whole (the node's own, then a replica, then one
// rebuilt from parity: the fewest bytes between hosts). One new rank may hold several parts
// (a node's agent holds the snapshots of all its workers). `found` false when no group
// covers the state.
struct Holders {
  bool found = false;
  int64_t epoch = 0, step = 0;
  int old_world = 0;  // the world of the first part's layout (the resize line's)
  // One source of layout A: report `report`, held by new rank `holder`, with the boxes of its
  // layout slot that it holds (only its listed locals for a partial piece, and of a partly
  // held local only its arrived boxes).
  struct Part {
    int report = -1, holder = -1;
    parallel::RankLayout layout;
  };
  std::vector<Part> parts;  // by holder, then report: A.ranks[r]'s locals are r's parts' in order
  parallel::Layout a;       // layout A over the new world
  int count() const { return int(parts.size()); }
  bool mixed = false;   // parts of several layouts, or a part of a layout slot
  int snapshots = 0;    // parts that come from snapshots (any kind)
  int replicas = 0;     // of them, copies on another node than their own
  int rebuilt = 0;      // of them, rebuilt from parity
  std::string why_not;  // when not found: the first gap, for the log
};
// `world`: the new world's size (the first `world` reports are the ranks' live ones).
// `plans` gives the layouts' plans (a survivor's is the one it trained with; each world
// size's layout is planner::fit_layout's).
Holders choose_holders(planner::PlanCache& plans, const parallel::StateSpace& space,
                       const std::vector<HolderReport>& reports, int world);

// Reads the in-memory snapshot that report `r` offers, part `p` of a choice of step `step`:
// fresh tensors of p.layout's locals. IoError when it cannot be read (a block that does not
// match its checksum, a slot rewritten meanwhile): the world then chooses without it.
using ReadSnapshot = std::function<std::vector<core::Tensor>(
    const HolderReport& r, const Holders::Part& p, int64_t step)>;

// The holders a new world takes its state from (choose_holders), with the snapshot parts
// this rank serves in that choice already read: `got` maps their report indices to tensors.
// Snapshots are offered from their headers alone (checkpoint/snapshot_offers.h), so a
// corrupt block is found only by the rank that reads it; the world then votes, one
// all-reduce over `world` of which chosen reads failed anywhere, so that no rank waits in
// the router for a part that will never come. While any failed, every rank drops those
// reports (valid = 0 in `reports`, alike everywhere) and chooses again: the next source in
// the order (another copy of that step: a replica, one rebuilt from parity; then an
// older step every rank has), and when none covers the state `found` is false and the
// caller goes to the durable checkpoint. A part chosen again is not read again. Collective
// only when a choice has snapshot parts (every rank knows that from the reports). `notes`
// gets a line per failed vote, the same on every rank, for the log: which snapshots failed,
// where they were, and where the state comes from instead.
Holders choose_and_read(planner::PlanCache& plans, const parallel::StateSpace& space,
                        std::vector<HolderReport>& reports, int world_size,
                        comm::Communicator& world, const ReadSnapshot& read,
                        std::map<int, std::vector<core::Tensor>>& got,
                        std::vector<std::string>* notes = nullptr);

// What rank `rank` holds after its move (run_transition) threw: of each live part it moved
// from (h.parts with holder `rank`, whose tensors `src` holds in layout A's order), the local
// tensors not yet released, and what arrived of the new layout's local tensors (`arrived`,
// run_transition's: whole ones, and partly filled ones with their arrived boxes, as the
// piece of slot (new_world, new_rank)); the state of
// step h.step trained in epoch h.epoch. Parts read from snapshots are dropped (their agent
// still offers them). Not valid when nothing is left; rank and world are left to the caller
// (the world the worker last trained in).
HeldState held_after_move(const Holders& h, const std::vector<HolderReport>& reports, int rank,
                          const std::vector<core::Tensor>& src, const parallel::Arrived& arrived,
                          int new_world, int new_rank);

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
