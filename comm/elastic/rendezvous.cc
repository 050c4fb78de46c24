// Rendezvous: the CAS loops over the record (join, poll, leave, close) and the timers that
// quorum.h's pure rules leave to the caller (last call, waiting with too few nodes).
#include "comm/elastic/rendezvous.h"

#include <algorithm>
#include <thread>
#include <tuple>

#include "base/check.h"
#include "base/log.h"

namespace weft::comm {
namespace {

std::string secs(Millis t) { return str(double(t.count()) / 1000.0, " s"); }

}  // namespace

Rendezvous::Rendezvous(Store& store, RendezvousOptions options, Store* beat_store)
    : store_(store),
      options_((validate(options), std::move(options))),
      prefix_("rdzv/" + options_.run_id + "/"),
      heartbeat_(beat_store ? *beat_store : store, alive_key(options_.node_id),
                 options_.heartbeat_interval, options_.heartbeat_timeout,
                 options_.bind_alive_key ? witness_key(options_.node_id) : std::string()) {}

Rendezvous::~Rendezvous() { heartbeat_.stop(); }

std::pair<Bytes, MembershipRecord> Rendezvous::read_or_create() {
  MembershipRecord initial;
  initial.version = 1;
  initial.writer = options_.node_id;
  // Read while present (every poll comes here): over etcd a compare_set is a raft proposal
  // even when it writes nothing, and one forwarded to a leader dying at that moment is lost
  // without an answer until the request timeout (2 s), while a read in flight fails at once
  // with "leader changed" (restart_round() says the same). Created by compare_set: an empty
  // `expected` matches only an absent key, and a record another node wrote first is returned.
  Bytes raw = store_.check({state_key()})
                  ? store_.get(state_key())
                  : store_.compare_set(state_key(), {}, to_bytes(encode(initial)));
  return {raw, decode(to_string(raw), state_key())};
}

bool Rendezvous::write(const Bytes& old_raw, MembershipRecord& next) {
  MembershipRecord old = decode(to_string(old_raw), state_key());
  next.version = old.version + 1;
  next.writer = options_.node_id;
  Bytes desired = to_bytes(encode(next));
  // Returns `desired` only when this call wrote: no other writer produces these bytes
  // (writer id), and this one never writes the same version twice.
  if (store_.compare_set(state_key(), old_raw, desired) != desired) return false;
  // Wakes the agents parked on this version's change key. Best effort: a reader that
  // misses it still sees the record at its next poll.
  try {
    store_.set(change_key(next.version), {}, kChangeKeyTtl);
  } catch (const std::exception&) {
  }
  return true;
}

std::set<std::string> Rendezvous::alive_nodes(const MembershipRecord& r) {
  std::vector<std::string> ids;
  for (const auto& [id, rank] : r.members) ids.push_back(id);
  for (const auto& id : r.spares) ids.push_back(id);
  for (const auto& [id, rank] : r.departed) ids.push_back(id);
  std::vector<std::string> keys;
  for (const auto& id : ids) keys.push_back(alive_key(id));
  std::set<std::string> alive;
  if (keys.empty()) return alive;
  if (store_.check(keys)) return {ids.begin(), ids.end()};  // the common case: one round trip
  for (size_t i = 0; i < ids.size(); ++i) {
    if (store_.check({keys[i]})) {
      alive.insert(ids[i]);
    } else if (r.rank_of(ids[i]) && !lost_causes_.count(ids[i])) {
      // Seen gone for the first time: say why now, while the witness still tells.
      lost_causes_[ids[i]] = lost_cause_locked(ids[i]);
    }
  }
  return alive;
}

std::string Rendezvous::lost_cause(const std::string& node_id) {
  std::lock_guard<std::mutex> lock(mu_);
  return lost_cause_locked(node_id);
}

std::string Rendezvous::lost_cause_locked(const std::string& node_id) {
  auto seen = lost_causes_.find(node_id);
  if (seen != lost_causes_.end()) return seen->second;
  if (store_.check({alive_key(node_id)})) return "alive";
  if (store_.check({lost_key(node_id)})) return to_string(store_.get(lost_key(node_id)));
  // The witness outlives the bound key only when the store dropped the key for its closed
  // connection; by TTL the witness goes first (heartbeat.h).
  if (store_.check({witness_key(node_id)}))
    return "its store connection closed (the store dropped its connection-bound alive key: "
           "its agent's process is gone)";
  return str("its heartbeat expired (none for ", secs(options_.heartbeat_timeout), ")");
}

void Rendezvous::note_lost(const MembershipRecord& before, const MembershipRecord& after) {
  for (const auto& [id, rank] : before.members) {
    if (id == options_.node_id || after.members.count(id) || before.has_left(id) ||
        after.departed.count(id))
      continue;
    std::string cause;
    try {
      cause = lost_cause_locked(id);
    } catch (const std::exception& e) {
      cause = str("unknown (", e.what(), ")");
    }
    // An epoch drops a member whose key is still there only because it left: this agent,
    // woken by a later write, never read the record that said so.
    if (cause == "alive") cause = "it left the membership (its alive key was still there)";
    WEFT_INFO("elastic", "node ", options_.node_id, " sees node ", id, " (node rank ", rank,
              ") lost in epoch ", before.epoch, ": ", cause);
  }
}

Decision Rendezvous::decide_now(const MembershipRecord& r, const std::set<std::string>& alive) {
  const auto now = Clock::now();
  if (last_call_since_ && last_call_epoch_ != r.epoch) last_call_since_.reset();
  const Millis last_call =
      r.epoch > 0 && grow_last_call_ ? *grow_last_call_ : options_.last_call;
  bool passed = last_call.count() == 0 || (last_call_since_ && now - *last_call_since_ >= last_call);
  Decision d = decide(r, alive, options_.min_nodes, options_.max_nodes, passed);
  if (d.verdict == Verdict::kLastCall) {
    if (!last_call_since_) {
      last_call_since_ = now;
      last_call_epoch_ = r.epoch;
    }
  } else if (d.verdict != Verdict::kForm) {
    last_call_since_.reset();
  }
  return d;
}

bool lost_a_process(const Membership& was, const Membership& now) {
  if (now.epoch <= was.epoch) return false;
  if (now.epoch - was.epoch > kProcessLossEpochs) return true;  // older notes are forgotten
  for (const auto& [epoch, id] : now.process_losses) {
    if (epoch <= was.epoch) continue;
    for (const Member& x : was.members)
      if (x.node_id == id) return true;
  }
  return false;
}

std::map<int64_t, bool> losses_since(const std::map<int64_t, Membership>& worlds,
                                     const Membership& now) {
  std::map<int64_t, bool> out;
  for (const auto& [epoch, was] : worlds)
    if (epoch < now.epoch) out[epoch] = lost_a_process(was, now);
  return out;
}

Membership Rendezvous::make_membership(const MembershipRecord& r) const {
  Membership m;
  m.epoch = r.epoch;
  for (const auto& [id, rank] : r.members) {
    if (!r.has_left(id)) m.members.push_back({id, rank});
    else m.settled = false;
  }
  std::sort(m.members.begin(), m.members.end(),
            [](const Member& a, const Member& b) { return a.node_rank < b.node_rank; });
  for (size_t i = 0; i < m.members.size(); ++i) {
    if (m.members[i].node_id != options_.node_id) continue;
    m.index = int(i);
    m.node_rank = m.members[i].node_rank;
  }
  m.store_prefix = str(prefix_, "epoch/", r.epoch);
  for (const auto& [id, rank] : r.departed) m.departed.push_back({id, rank});
  m.replaced = r.replaced;
  m.process_losses = r.process_losses;
  m.round = r.round;
  // By rank, then id: departed nodes of different epochs may have held the same slot.
  std::sort(m.departed.begin(), m.departed.end(), [](const Member& a, const Member& b) {
    return std::tie(a.node_rank, a.node_id) < std::tie(b.node_rank, b.node_id);
  });
  return m;
}

void Rendezvous::adopt(const MembershipRecord& r) {
  bool changed = !membership_ || membership_->epoch != r.epoch;
  membership_ = make_membership(r);
  last_call_since_.reset();
  too_few_since_.reset();
  lost_causes_.clear();
  seen_ = r;
  if (changed)
    WEFT_INFO("elastic", "node ", options_.node_id, " is rank ", membership_->node_rank,
              " of epoch ", r.epoch, " (", membership_->world(), " nodes)");
}

Membership Rendezvous::join() {
  std::lock_guard<std::mutex> lock(mu_);
  const auto deadline = Clock::now() + options_.join_timeout;
  const std::string& me = options_.node_id;
  joined_ = true;
  heartbeat_.start();
  if (!told_liveness_) {
    told_liveness_ = true;
    if (heartbeat_.bound())
      WEFT_INFO("elastic", "node ", me, "'s liveness: ", heartbeat_.key(),
                " is bound to its store connection (the others know within the store's grace "
                "once its processes die) with a TTL of ",
                secs(options_.heartbeat_timeout), " for a host that vanishes");
    else
      WEFT_INFO("elastic", "node ", me, "'s liveness: ", heartbeat_.key(), " is a TTL key (",
                secs(options_.heartbeat_timeout),
                options_.bind_alive_key
                    ? "; this store cannot bind keys to a connection): a lost node is known "
                      "heartbeat_timeout after its last beat"
                    : "; bind_alive_key is off): a lost node is known heartbeat_timeout after "
                      "its last beat");
  }
  std::string waiting_for = "the store";
  for (;;) {
    auto [raw, rec] = read_or_create();
    if (rec.closed) {
      heartbeat_.stop_and_erase();
      throw RendezvousClosedError(str("rendezvous ", state_key(), " is closed (", rec.close_reason,
                                      "): node ", me, " may not join; the job is over"));
    }
    if (rec.rank_of(me)) {
      adopt(rec);
      return *membership_;
    }
    bool wrote = false;
    if (!rec.has_left(me)) {  // a member that left rejoins once the others re-formed
      if (!rec.is_spare(me)) {
        MembershipRecord next = rec;
        next.spares.push_back(me);
        // Said once written (the agent's "waits as a spare" comes before): from here a
        // member's loss admits this node in the epoch that drops the member.
        if (write(raw, next) && rec.epoch > 0 && int(rec.members.size()) >= options_.max_nodes)
          WEFT_INFO("elastic", "node ", me, " is registered as a spare of epoch ", rec.epoch,
                    " (full at max_nodes=", options_.max_nodes, ")");
        continue;  // re-read: registered, or someone else wrote first
      }
      Decision d = decide_now(rec, alive_nodes(rec));
      if (d.verdict == Verdict::kForm) {
        if (write(raw, d.next))
          WEFT_INFO("elastic", "node ", me, " formed epoch ", d.next.epoch, ": ", d.why);
        wrote = true;
      } else if (rec.epoch > 0 && int(rec.members.size()) >= options_.max_nodes &&
                 d.verdict == Verdict::kStable) {
        waiting_for = str("a free slot: waiting as a spare, the membership of epoch ", rec.epoch,
                          " is full at max_nodes=", options_.max_nodes);
      } else {
        waiting_for = d.why;
      }
    } else {
      waiting_for = "the others to re-form after this node left";
    }
    if (wrote) continue;
    const auto now = Clock::now();
    if (now >= deadline) {
      heartbeat_.stop_and_erase();
      throw TimeoutError(str("rendezvous ", state_key(), ": node ", me,
                             " could not join within join_timeout (", secs(options_.join_timeout),
                             "); last seen: ", waiting_for,
                             ". Start more nodes, or raise --rdzv-conf join_timeout"));
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(options_.poll_interval, deadline - now));
  }
}

std::optional<Membership> Rendezvous::poll_change() {
  std::lock_guard<std::mutex> lock(mu_);
  WEFT_CHECK(membership_, "Rendezvous::poll_change() before join() (or after leave)");
  const std::string& me = options_.node_id;
  const int64_t mine = membership_->epoch;
  for (;;) {
    auto [raw, rec] = read_or_create();
    if (rec.closed) {
      heartbeat_.stop();
      throw RendezvousClosedError(
          str("rendezvous ", state_key(), " was closed: ", rec.close_reason));
    }
    if (rec.epoch != mine || !rec.rank_of(me)) {
      if (rec.rank_of(me)) {
        if (seen_ && seen_->epoch == mine) note_lost(*seen_, rec);
        adopt(rec);
        return membership_;
      }
      heartbeat_.stop_and_erase();
      membership_.reset();
      std::optional<std::string> hb = heartbeat_.failure();
      throw QuorumLostError(
          str("node ", me, " was removed from the membership: epoch ", rec.epoch,
              " was formed without it (its heartbeat expired: ",
              hb ? "last heartbeat error: " + *hb : "partitioned from the others or too slow",
              "); it stops its workers and may join again"));
    }
    seen_ = rec;
    const std::set<std::string> alive = alive_nodes(rec);
    Decision d = decide_now(rec, alive);
    if (d.verdict == Verdict::kForm && !leaves_settled(rec, alive)) return std::nullopt;
    switch (d.verdict) {
      case Verdict::kForm: {
        if (!d.next.rank_of(me)) {
          // This node's own key is gone: it cannot vouch for itself, so it must not write.
          heartbeat_.stop_and_erase();
          membership_.reset();
          throw QuorumLostError(str("node ", me, " sees its own heartbeat key expired in epoch ",
                                    mine, " (", d.why, "); it stops so that the others re-form"));
        }
        if (!write(raw, d.next)) continue;  // someone else wrote first: look again
        WEFT_INFO("elastic", "node ", me, " formed epoch ", d.next.epoch, ": ", d.why);
        note_lost(rec, d.next);
        adopt(d.next);
        return membership_;
      }
      case Verdict::kQuorumLost:
      case Verdict::kTooFew: {
        // Decide only on a consistent snapshot: the record did not change while the
        // heartbeats were read (a graceful leave writes the record before erasing its key).
        if (store_.compare_set(state_key(), {}, {}) != raw) continue;
        if (d.verdict == Verdict::kQuorumLost) {
          heartbeat_.stop_and_erase();
          membership_.reset();
          throw QuorumLostError(str("node ", me, " lost quorum in epoch ", mine, ": ", d.why,
                                    ". It is in a minority partition (or the majority died) "
                                    "and stops itself so that there is never a split brain"));
        }
        const auto now = Clock::now();
        if (!too_few_since_) too_few_since_ = now;
        if (now - *too_few_since_ >= options_.join_timeout)
          throw TimeoutError(str("rendezvous ", state_key(), ": epoch ", mine,
                                 " lost members and could not re-form within join_timeout (",
                                 secs(options_.join_timeout), "): ", d.why));
        return std::nullopt;
      }
      case Verdict::kStable:
      case Verdict::kLastCall:
        too_few_since_.reset();
        return std::nullopt;
    }
  }
}

// A last call for leaves, as join() has one for arrivals: nodes a scheduler preempts together
// (SIGTERM to several agents at once) write their leaves a few milliseconds apart, and an
// epoch formed after the first would hold the second as a member; its leave then forms
// another epoch at once, the survivors skip the first one's world, and the first leaver,
// posted only that world, never hands its state over. So while every remaining member is
// alive (a loss forms its epoch at once) and someone has left, the epoch forms only once the
// record has stood still for a poll_interval: each further leave starts the wait again. Only
// leaves that hand state over wait: a node whose workers failed leaves without (leave(false))
// and its epoch, like a loss's, forms at once.
bool Rendezvous::leaves_settled(const MembershipRecord& rec, const std::set<std::string>& alive) {
  if (rec.left.empty()) {
    leaves_seen_.reset();
    return true;
  }
  for (const auto& id : rec.left)
    if (std::find(rec.hands_over.begin(), rec.hands_over.end(), id) == rec.hands_over.end())
      return true;
  for (const auto& [id, rank] : rec.members)
    if (!rec.has_left(id) && !alive.count(id)) return true;  // a loss too: no waiting
  const auto now = Clock::now();
  if (!leaves_seen_ || leaves_seen_->first != rec.version) leaves_seen_ = {rec.version, now};
  return now - leaves_seen_->second >= options_.poll_interval;
}

std::optional<Membership> Rendezvous::watch(Millis timeout) {
  const auto until = Clock::now() + timeout;
  for (;;) {
    if (auto m = poll_change()) return m;
    const auto now = Clock::now();
    if (now >= until) return std::nullopt;
    std::this_thread::sleep_for(std::min<Clock::duration>(options_.poll_interval, until - now));
  }
}

std::optional<Membership> Rendezvous::renew(const std::vector<int>& local_ranks) {
  std::lock_guard<std::mutex> lock(mu_);
  WEFT_CHECK(membership_, "Rendezvous::renew() before join() (or after leave)");
  const std::string& me = options_.node_id;
  for (;;) {
    auto [raw, rec] = read_or_create();
    if (rec.closed)
      throw RendezvousClosedError(
          str("rendezvous ", state_key(), " was closed: ", rec.close_reason));
    if (rec.epoch != membership_->epoch || !rec.rank_of(me) || !rec.left.empty())
      return std::nullopt;
    MembershipRecord next = rec;
    next.epoch = rec.epoch + 1;
    next.left.clear();
    next.hands_over.clear();
    next.replaced.clear();  // departed stay: their hand-over is not confirmed
    for (int local : local_ranks) next.replaced.emplace_back(local, me);
    if (!local_ranks.empty()) next.note_process_loss(me);
    if (!write(raw, next)) continue;  // another write came first: look again
    WEFT_INFO("elastic", "node ", me, " renewed epoch ", rec.epoch, " as ", next.epoch,
              ": it replaces ", local_ranks.size(), " worker(s) in place");
    adopt(next);
    return membership_;
  }
}

void Rendezvous::leave(bool hands_over) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!joined_) return;
  const std::string& me = options_.node_id;
  for (;;) {
    auto [raw, rec] = read_or_create();
    MembershipRecord next = rec;
    bool changed = false;
    if (rec.rank_of(me)) {
      next.left.push_back(me);
      if (hands_over) next.hands_over.push_back(me);
      changed = true;
    }
    auto it = std::find(next.spares.begin(), next.spares.end(), me);
    if (it != next.spares.end()) {
      next.spares.erase(it);
      changed = true;
    }
    if (!changed || write(raw, next)) break;
  }
  membership_.reset();
  if (hands_over) {
    // The heartbeat goes on until confirm_handover: the others tell a departing node that
    // died from one that is handing over.
    WEFT_INFO("elastic", "node ", me, " left the membership; it hands its state over first");
    return;
  }
  // After the record says so, never before: see poll_change's consistent snapshot.
  heartbeat_.stop_and_erase();
  joined_ = false;
  WEFT_INFO("elastic", "node ", me, " left the membership");
}

Rendezvous::HandOver Rendezvous::confirm_handover(int64_t epoch, int64_t round) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string& me = options_.node_id;
  for (;;) {
    auto [raw, rec] = read_or_create();
    const bool listed = !rec.closed && rec.departed.count(me);
    // A later round stops the workers its world had (those that took this node's state over),
    // and every agent that read it counts this node's: confirming now would leave that world
    // waiting for workers that end, or agents disagreeing on it (issue 14).
    if (listed && (rec.epoch != epoch || rec.round != round)) return HandOver::kCarried;
    if (listed) {
      MembershipRecord next = rec;
      next.departed.erase(me);
      if (!write(raw, next)) continue;  // another write came first: look again
    }
    break;
  }
  // After the record says so, never before: a departed node whose key is gone while the
  // record lists it is one that died (decide re-forms without it).
  if (joined_) heartbeat_.stop_and_erase();
  joined_ = false;
  WEFT_INFO("elastic", "node ", me, " confirmed its hand-over in epoch ", epoch, " round ", round);
  return HandOver::kReleased;
}

void Rendezvous::close(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  for (;;) {
    auto [raw, rec] = read_or_create();
    if (rec.closed) return;
    MembershipRecord next = rec;
    next.closed = true;
    next.close_reason = reason.empty() ? "closed" : reason;
    if (write(raw, next)) break;
  }
  WEFT_INFO("elastic", "rendezvous ", state_key(), " closed: ", reason);
}

int64_t Rendezvous::restart_round() {
  std::lock_guard<std::mutex> lock(mu_);
  return read_or_create().second.round;
}

int64_t Rendezvous::ask_round(int64_t after) {
  std::lock_guard<std::mutex> lock(mu_);
  for (;;) {
    auto [raw, rec] = read_or_create();
    if (rec.closed || rec.round != after) return rec.round;
    MembershipRecord next = rec;
    next.round = after + 1;
    if (write(raw, next)) return next.round;  // else another write came first: look again
  }
}

MembershipRecord Rendezvous::read_record() {
  std::lock_guard<std::mutex> lock(mu_);
  return read_or_create().second;
}

std::optional<Membership> Rendezvous::membership() const {
  std::lock_guard<std::mutex> lock(mu_);
  return membership_;
}

}  // namespace weft::comm
