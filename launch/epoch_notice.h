// How a node's agent tells its running workers that the membership changed, without a store
// round trip on every step: a small file (WEFT_EPOCH_FILE, in the agent's scratch folder)
// that the agent replaces atomically (write, then rename) with each new epoch. A worker
// stat()s it at every step boundary (microseconds) and reads it only when it changed; a
// background watcher reads it while a step runs, to abort collectives that wait on a member
// the new epoch lost.
//
// Workers that follow notices say so once, with a marker file beside it per local rank
// (`<file>.live.<local rank>`): an agent whose workers all follow keeps them running across
// membership changes (elastic.on_change: reshard); otherwise it restarts them.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <sys/types.h>

namespace weft::launch {

inline constexpr const char* kEpochFileVar = "WEFT_EPOCH_FILE";

struct EpochNotice {
  int64_t epoch = 0;  // the membership epoch (WEFT_RDZV_EPOCH of a worker started in it)
  int node_index = 0, nnodes = 1, nproc = 1;  // a worker's rank: node_index * nproc + local
  std::string store_host;
  int store_port = 0;
  std::string store_prefix;  // the epoch's bootstrap keys (WEFT_STORE_PREFIX)
  // A member of the previous epoch is gone: collectives waiting on it never finish, so a
  // worker aborts them at once instead of waiting out the communicator's timeout.
  bool lost = false;
  // The latest epoch whose membership record noted a process of the world before it lost
  // (comm::MembershipRecord::process_losses; 0: none noted). `lost` is decided against the
  // agent's previous notice, which a worker may never have read (two notices within one of
  // its looks): a worker in an epoch before `lost_at` decides against its own epoch.
  int64_t lost_at = 0;
  // Per epoch whose membership this node's agent still has (the worlds its workers may be
  // in: the epochs it started or posted, the latest kProcessLossEpochs): whether that world
  // lost a process since (comm::lost_a_process against this notice's epoch). A worker in one
  // of them decides by it, exactly: a node that joined after its epoch and died is not one
  // of its world's processes. `lost_at` decides for a worker in an epoch not listed.
  std::map<int64_t, bool> lost_since;
  // TORCHELASTIC_RESTART_COUNT of a worker started in this epoch ((epoch - 1) + round): a
  // parked spare's worker, started before it had an epoch, takes it from its first notice
  // (its run folder and metrics continue the job's, as a newcomer's do). -1: not given.
  int restart_count = -1;
  std::string why;  // "membership changed: epoch 2 -> 3, 4 -> 2 nodes (lost a-12, b-9)"
  // Nodes of the epoch's first world, the transition: the members (node_index < nnodes),
  // then the nodes that left the previous epoch gracefully, whose workers hand their state
  // over there and end (`leave` on their own notice). 0: nnodes.
  int transit_nodes = 0;
  bool leave = false;
  // On a departing node's notice of the epoch its workers handed over in: the hand-over is
  // confirmed (comm::Rendezvous::confirm_handover), the workers end. Written over the same
  // epoch's notice, so EpochWatch::newer() does not report it; a worker waiting for its
  // release reads the notice itself (released_in).
  bool released = false;
  int world() const { return nnodes * nproc; }  // the ranks that train
  // Whether a worker in `epoch` must abort its world's collectives now: a process of its
  // world (or of a later one) is gone since.
  bool loses_process_of(int64_t epoch) const {
    if (auto it = lost_since.find(epoch); it != lost_since.end()) return it->second;
    return lost || lost_at > epoch;
  }
  int transit_world() const { return std::max(transit_nodes, nnodes) * nproc; }
};

// Atomic replacement (temporary file + rename): a reader sees the old notice or the new
// one, never half of one. IoError naming the path on failure.
void write_epoch_notice(const std::string& path, const EpochNotice& n);
// nullopt when the file is absent; IoError for a malformed one.
std::optional<EpochNotice> read_epoch_notice(const std::string& path);

// The worker's side: which notice it last acted on, and a cheap check for a newer one.
class EpochWatch {
 public:
  // `path` empty: never changes (not under an agent that sends notices).
  EpochWatch(std::string path, int64_t epoch) : path_(std::move(path)), epoch_(epoch) {}
  const std::string& path() const { return path_; }
  int64_t epoch() const { return epoch_; }
  // A notice of a later epoch than epoch(), if the file holds one (stat first; the file is
  // read only when its identity or mtime changed since the last look). One thread per
  // EpochWatch: a watcher thread beside the trainer uses a copy of its own.
  std::optional<EpochNotice> newer() const;
  // The worker moves to `n`'s epoch.
  void adopt(const EpochNotice& n) { epoch_ = n.epoch; }

 private:
  std::string path_;
  int64_t epoch_;
  mutable ino_t ino_ = 0;
  mutable int64_t mtime_ = 0;
  mutable std::optional<EpochNotice> cached_;
};

// Sleeps until the notice at `path` may have changed (the agent renamed a new one into its
// folder: inotify IN_MOVED_TO) or `max` passed, whichever comes first, so that a watcher that
// looks again after each wait learns of a notice when it is written rather than at its next
// interval. Without inotify (or with an empty path) a plain sleep of `max`. One thread each.
class NoticeWaiter {
 public:
  explicit NoticeWaiter(const std::string& path);
  ~NoticeWaiter();
  NoticeWaiter(const NoticeWaiter&) = delete;
  NoticeWaiter& operator=(const NoticeWaiter&) = delete;
  // True when a change in the folder woke it, false when `max` passed (or no inotify).
  bool wait(std::chrono::milliseconds max);
  bool watching() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Marker files: a worker of local rank `local_rank` follows notices; an agent checks that
// all `nproc` of its workers do.
void mark_following(const std::string& path, int local_rank);
bool all_following(const std::string& path, int nproc);

// A departing worker's word to its agent (`<file>.handed.<local rank>`, holding the epoch):
// it handed its state over in the world of `epoch` and waits to be released (or to follow a
// later epoch that still lists its node as departed). The agent confirms once all `nproc`
// of its workers said so for the epoch it posted.
void mark_handed_over(const std::string& path, int local_rank, int64_t epoch);
bool all_handed_over(const std::string& path, int nproc, int64_t epoch);
// Removes what stopped workers said (before new ones start to hand over in the same epoch: a
// restart round's). Never throws.
void clear_handed_over(const std::string& path, int nproc);
// Whether the notice at `path` releases the workers that handed over in `epoch`.
bool released_in(const std::string& path, int64_t epoch);

}  // namespace weft::launch
