// Rendezvous: one elastic agent's view of the job's membership. It joins (blocking until
// admitted to an epoch), heartbeats, notices lost members and waiting nodes, and re-forms
// the membership under the quorum rules of quorum.h, over any comm::Store.
//
// Store keys (all under rdzv/<run id>/):
//   state              the MembershipRecord (membership_record.h), changed only by CAS loops;
//                      it holds the job's restart round too (MembershipRecord::round)
//   alive/<node id>    the node's heartbeat, a TTL key (heartbeat.h), bound to the node's
//                      store connection too where the store can (bind_alive_key)
//   beat/<node id>     the alive key's witness, a TTL key set just before it when bound:
//                      present while alive/ is gone means the node's connection closed
//   peer/<node id>     the node's peer check listener, where the store cannot bind (etcd)
//   lost/<node id>     why a peer check erased the node's alive key (a TTL key)
//   changed/<version>  set (with a TTL) by whoever wrote that version of the record, right
//                      after it: an agent parks a store wait on the next one
//   epoch/<E>/...      free for the layer above (Membership::store_prefix): Gloo/NCCL
//                      bootstrap of epoch E never collides with epoch E-1's keys
//
// Survivors stay alive across membership changes: an agent learns of a new epoch from
// poll_change()/watch() and hands the new Membership to its workers at a step boundary;
// nothing here requires a restart. Node ranks are stable across epochs (quorum.h).
//
// Threads: join, poll_change, watch, leave and close are serialised by an internal mutex
// (one agent thread normally calls them all); the heartbeat runs on its own thread.
// Errors: CommError/TimeoutError from the store propagate; plus the two below.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/error.h"
#include "comm/elastic/heartbeat.h"
#include "comm/elastic/membership_record.h"
#include "comm/elastic/quorum.h"
#include "comm/elastic/rendezvous_options.h"
#include "comm/store/store.h"

namespace weft::comm {

// The job was closed (finished or failed): nobody may join or stay. what() has the reason.
class RendezvousClosedError : public CommError {
 public:
  using CommError::CommError;
};

// This node may not go on in the membership: it sees fewer than a strict majority of its
// epoch's members alive (a partitioned minority), or a newer epoch was formed without it
// (its heartbeat expired). It must stop its workers; it may join() again as a newcomer.
class QuorumLostError : public CommError {
 public:
  using CommError::CommError;
};

struct Member {
  std::string node_id;
  int node_rank = 0;
  bool operator==(const Member&) const = default;
};

// What an agent needs to run its workers in one epoch.
struct Membership {
  int64_t epoch = 0;            // >= 1
  int node_rank = 0;            // this node's stable slot, in [0, max_nodes), may have gaps
  int index = 0;                // this node's position in `members`: its dense rank in [0, world)
  std::vector<Member> members;  // by node_rank
  std::string store_prefix;     // "rdzv/<run id>/epoch/<epoch>": keys for this epoch's bootstrap
  // False when a member of the epoch has left since it formed (`members` leaves it out, so
  // two nodes may see different member lists for one epoch until the next epoch re-forms
  // without it, which the next poll does): a group that must agree on the world of an
  // epoch (live workers) waits for a settled one.
  bool settled = true;
  // Departing nodes whose hand-over is not confirmed (MembershipRecord::departed), by node
  // rank (then id): live workers of theirs join this epoch's world after the members' ranks
  // to hand their state over, then end once their agent confirmed it.
  std::vector<Member> departed;
  // Workers replaced in place by this epoch (MembershipRecord::replaced): (local rank, node
  // id). Not empty: the epoch renewed the previous one's members because a worker died.
  std::vector<std::pair<int, std::string>> replaced;
  // The record's notes of nodes whose processes died (MembershipRecord::process_losses).
  std::vector<std::pair<int64_t, std::string>> process_losses;
  // The job's restart round (MembershipRecord::round) in the same read of the record as
  // `departed`: an attempt started in this round counts exactly these departing nodes, as
  // every other agent's attempt in it does.
  int64_t round = 0;
  int world() const { return int(members.size()); }
};

// Whether a process of `was`'s world is gone by `now` (a later epoch of the same job): a
// member of `was` lost, or with a worker replaced in place, in any epoch after `was` up to
// `now`, as `now`'s notes say; also true when `now` no longer has notes that far back. An
// agent that polls once per interval may see `now` several epochs after its workers' `was`
// (a renewal and a join formed within one poll): the epochs in between decide, not the
// difference between the two member lists. Live workers told so abort the old world's
// collectives at once instead of waiting for their timeout.
bool lost_a_process(const Membership& was, const Membership& now);
// lost_a_process(w, now) for each world `w` of `worlds` (by epoch) before `now`.
std::map<int64_t, bool> losses_since(const std::map<int64_t, Membership>& worlds,
                                     const Membership& now);

class Rendezvous {
 public:
  // Validates `options` (ConfigError naming the key, rendezvous_options.h). `store` must
  // outlive this object. Touches the store only when a method is called.
  // `beat_store`, when given (and outliving this object), carries the heartbeat instead of
  // `store`: a store whose keys end by TTL only (etcd) gives the beats a connection of their
  // own, since a call holds its connection for its whole exchange, and a beat written as the
  // etcd leader died waits out its request timeout (2 s) with no answer, which held every
  // call of the agent's monitor behind it. Where keys bind to the connection (TCPStore) the
  // beat must go over `store`, the connection whose close drops the key.
  Rendezvous(Store& store, RendezvousOptions options, Store* beat_store = nullptr);
  // Stops the heartbeat without erasing the key (the node fades out by TTL, or when its store
  // connection closes if the key is bound, as after a crash; call leave() to go at once).
  // Never throws.
  ~Rendezvous();
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  // Starts the heartbeat, registers as waiting, and helps form the epoch (any waiting node
  // may write it), until this node is a member; returns that membership. Blocks at most
  // join_timeout, then throws TimeoutError saying what it waited for (too few nodes, or
  // waiting as a spare because the membership is full at max_nodes). Throws
  // RendezvousClosedError when the job is closed. Returns at once when already a member.
  Membership join();

  // One check, for a member (after join()): re-reads the record and the members' and
  // spares' heartbeats and, when the quorum rules call for a new epoch, writes it. Returns
  // the new membership when the epoch changed (by this node's write or another's), nullopt
  // when it did not (the fast path, a last call in progress, or too few nodes for now).
  // Never blocks beyond a few store round trips. Throws QuorumLostError (after stopping
  // the heartbeat) when this node is in a minority or was removed, RendezvousClosedError
  // when closed, TimeoutError when the membership could not be re-formed (too few nodes)
  // for join_timeout. InternalError when called before join().
  std::optional<Membership> poll_change();

  // poll_change() every poll_interval until it returns a membership or `timeout` passes
  // (then nullopt). Same errors.
  std::optional<Membership> watch(Millis timeout);

  // In-place replacement: a worker of this member died and its agent starts another in its
  // slot. Writes epoch E+1 with the members of E (spares still waiting stay spares) and
  // `local_ranks` of this node as `replaced`, so that every agent posts the new epoch to its
  // live workers as one that lost a process. Returns the new membership; nullopt when the
  // record is not this node's current epoch any more, or a member left it (a change is
  // pending: poll_change() forms it, and the caller renews after that). Throws like
  // poll_change (RendezvousClosedError, store errors). InternalError before join().
  std::optional<Membership> renew(const std::vector<int>& local_ranks);

  // Graceful departure: marks this node as left in the record (or drops it from the
  // spares), so that the others re-form at their next poll without waiting for the TTL.
  // `hands_over`: its live workers will hand their state over in the next epoch's first
  // world (the epoch lists it as departed, and so does every later epoch until
  // confirm_handover); its heartbeat goes on until then, so that the others can tell a
  // departing node that died (they re-form without it). Otherwise (a node whose workers are
  // gone) the heartbeat stops and its key goes now. Idempotent; no-op if never joined.
  void leave(bool hands_over = false);

  // After leave(true), once this node's workers handed their state over in the world of
  // `epoch`'s restart round `round`: removes this node from the record's departed
  // (compare-and-set, so it is ordered against the formation of the next epoch and against
  // a round asked for, ask_round), then stops the heartbeat. kCarried: a later epoch formed
  // first, or a later round was asked, and the record still lists this node as departed: its
  // workers hand over again there (the world of `epoch` may never have formed; the round's
  // world replaces the one they handed over in, and counts them, since every agent reads the
  // round and the departed together), and the caller confirms that one later. kReleased:
  // confirmed (or no epoch lists this node any more, or the job closed): its workers may end.
  // Throws as the store does.
  enum class HandOver { kReleased, kCarried };
  HandOver confirm_handover(int64_t epoch, int64_t round);

  // Closes the job for everyone: members' next poll and late joiners throw
  // RendezvousClosedError with `reason`. Idempotent (the first reason stays).
  void close(const std::string& reason);

  // How long a membership that formed already waits for more spares before it grows to
  // admit the ones waiting (the last call of epochs after the first; default: last_call).
  // An agent whose workers reshard live sets it short: a resize costs them a step boundary
  // and a transfer, not a restart, so a newcomer should train within seconds.
  void set_grow_last_call(Millis t) {
    std::lock_guard<std::mutex> lock(mu_);
    grow_last_call_ = t;
  }

  // `r` as this node's Membership would read it (members that left excluded, `departed`).
  Membership view(const MembershipRecord& r) const { return make_membership(r); }

  // The latest record (one store read), for status lines and tests.
  MembershipRecord read_record();
  // The job's restart round (MembershipRecord::round), 0 until one is asked for: one read of
  // the record once it exists. Agents look at every monitor pass, and over etcd a write is a
  // raft proposal, which is lost without an answer when a follower forwards it to a leader
  // dying at that moment (the call then runs out its request timeout), whereas a read in
  // flight there fails at once with "leader changed" and goes to the next member. Throws as
  // the store does.
  int64_t restart_round();
  // Asks for the restart round after `after` (the round of an attempt whose workers failed):
  // moves the record's round from `after` to after + 1 by compare-and-set, so that the round
  // and the departing nodes its world counts are written together and ordered against every
  // hand-over confirmation. Returns the record's round then: after + 1, by this call or by
  // another agent's that came first, or later still; a closed job's round is returned as it
  // is (the caller's next poll throws RendezvousClosedError). Throws as the store does.
  int64_t ask_round(int64_t after);
  // The key whoever writes version `version` of the record sets right after it (TTL
  // kChangeKeyTtl): an agent keeps a store wait parked on the next one to look at the
  // membership as soon as it changes instead of at its next poll (launch/membership_wake.h).
  // Every write sets one: a member leaving, an epoch formed, a spare registering, a close.
  std::string change_key(int64_t version) const {
    return prefix_ + "changed/" + std::to_string(version);
  }
  // How long a change key stays: a waiter parks only on the version after one it read.
  static constexpr Millis kChangeKeyTtl{60'000};
  // This node's membership as of the last join/poll, if any.
  std::optional<Membership> membership() const;
  Heartbeat& heartbeat() { return heartbeat_; }
  const RendezvousOptions& options() const { return options_; }
  std::string state_key() const { return prefix_ + "state"; }
  std::string alive_key(const std::string& node_id) const { return prefix_ + "alive/" + node_id; }
  std::string witness_key(const std::string& node_id) const { return prefix_ + "beat/" + node_id; }
  // Where a node's agent publishes its peer check listener ("host:port", peer_check.h).
  std::string peer_key(const std::string& node_id) const { return prefix_ + "peer/" + node_id; }
  // Why a peer check reported the node lost, set just before it erased the node's alive key.
  std::string lost_key(const std::string& node_id) const { return prefix_ + "lost/" + node_id; }
  // Why `node_id`'s alive key is gone, for the log: the peer check's note when one reported
  // it (lost_key: "its peer connection closed (...)"), "its store connection closed (...)" when
  // its witness is still there (the store dropped the bound key: its processes died), else
  // "its heartbeat expired (none for <heartbeat_timeout>)". The cause this agent saw when it
  // first found the key gone, if it did since the last epoch; else it looks now (two store
  // reads). "alive" when the key is there. Throws as the store does.
  std::string lost_cause(const std::string& node_id);

 private:
  // Reads the record, creating an empty one when the key is absent (one round trip).
  std::pair<Bytes, MembershipRecord> read_or_create();
  // CAS from `old_raw` to `next` stamped with version+1 and this writer; true when it wrote.
  bool write(const Bytes& old_raw, MembershipRecord& next);
  // Node ids of members, spares and departed nodes whose alive key exists.
  std::set<std::string> alive_nodes(const MembershipRecord& r);
  // decide() with this agent's last_call clock; updates the clock.
  Decision decide_now(const MembershipRecord& r, const std::set<std::string>& alive);
  // Whether an epoch that lets `rec`'s leavers go may form now (see leaves_seen_).
  bool leaves_settled(const MembershipRecord& rec, const std::set<std::string>& alive);
  Membership make_membership(const MembershipRecord& r) const;
  void adopt(const MembershipRecord& r);  // membership_ = r's, timers reset
  // Logs, for each member of `before` that is not in `after` and did not leave, why it is
  // lost (lost_cause). Never throws: the log line is not worth a failed poll.
  void note_lost(const MembershipRecord& before, const MembershipRecord& after);
  std::string lost_cause_locked(const std::string& node_id);

  using Clock = std::chrono::steady_clock;
  Store& store_;
  const RendezvousOptions options_;
  const std::string prefix_;  // "rdzv/<run id>/"
  Heartbeat heartbeat_;
  mutable std::mutex mu_;
  std::optional<Membership> membership_;
  std::optional<Clock::time_point> last_call_since_;  // first kLastCall seen
  int64_t last_call_epoch_ = -1;                      // the epoch it was seen in
  std::optional<Clock::time_point> too_few_since_;    // first kTooFew seen as a member
  // A record with graceful leaves and no loss: its version and when this node first saw it.
  // The epoch that lets them go forms only once the record has stood still for a
  // poll_interval (leaves_settled), so leaves announced together go in one epoch.
  std::optional<std::pair<int64_t, Clock::time_point>> leaves_seen_;
  bool joined_ = false;                               // join() called, leave() not yet
  std::optional<Millis> grow_last_call_;              // set_grow_last_call()
  // Members whose alive key this agent found gone, with the cause it saw then; cleared when
  // an epoch is adopted.
  std::map<std::string, std::string> lost_causes_;
  std::optional<MembershipRecord> seen_;  // the record of this node's epoch last read
  bool told_liveness_ = false;            // the liveness path was logged
};

}  // namespace weft::comm
