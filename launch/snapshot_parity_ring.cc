// Erasure-coded snapshots (snapshot_parity.h): the rings of the epochs, and which nodes of
// the previous epoch a new ring has lost. Asked of the nodes, not read from their endpoints:
// a restarted agent listens on a new port, and a peer's ring of the previous epoch may still
// name its old one.
#include <unistd.h>

#include <algorithm>

#include "base/check.h"
#include "base/error.h"
#include "checkpoint/snapshot_stripes.h"
#include "launch/snapshot_parity.h"

namespace weft::launch {

namespace ckpt = checkpoint;
using json = nlohmann::json;

namespace {

// Calls `f(parsed name)` for each data or parity segment of `job` this process owns (made, or
// adopted from a dead predecessor: its owner is this process then).
template <typename F>
void for_each_owned(const std::string& job, F f) {
  for (const std::string& name : ckpt::snapshot_segments(job)) {
    const std::optional<ckpt::SegmentName> p = ckpt::parse_segment_name(name);
    if (!p || (p->kind != ckpt::SegmentKind::kData && p->kind != ckpt::SegmentKind::kParity))
      continue;
    try {
      if (ckpt::SnapshotSegment::open(name, false).owner_pid() == int(::getpid())) f(*p);
    } catch (const std::exception&) {  // gone meanwhile, or being made: not this node's
    }
  }
}

}  // namespace

void SnapshotParity::set_ring(ReplicaRing r) {
  const int n = int(r.nodes.size());
  const std::string here = str("epoch ", r.epoch, ": this node is node ", r.node, " of ", n, "; ");
  if (const std::optional<ckpt::StripeLayout> l = layout_of(r); l && !l->reduced()) {
    const int g = l->group_of(r.node);
    log_(str(here, "its snapshots are erasure-coded with ISA-L over its group of ",
             l->group_size(g), " nodes (", l->data_fragments(g), " data + ", o_.m,
             " parity fragments per stripe; any ", o_.m, " of them may be lost)"));
  } else if (l) {
    const int K = l->data_fragments(0);
    log_(str(here, "fewer than k + m = ", o_.k + o_.m,
             " nodes: its snapshots are erasure-coded with ISA-L over one group of all ", n,
             " nodes with fewer data fragments, K = ", K, " (", K, " data + ", o_.m,
             " parity fragments per stripe; any ", o_.m,
             " of them may be lost; each node holds parity of ", o_.m, "/", K,
             " of its own snapshot bytes, where its memory has room: see its reserve)"));
  } else {
    log_(str(here, "fewer than m + 1 = ", o_.m + 1,
             " nodes: its snapshots are not erasure-coded in this epoch"));
  }
  std::lock_guard<std::mutex> l(mu_);
  // A new epoch: which nodes of the previous one are lost is found on the rebuilder's thread
  // (new_ring: it asks the nodes, whose endpoints may have changed). The newest epoch's ring
  // told again with other endpoints (a peer's agent restarted, perhaps during a rebuild that
  // then could not reach it) is looked at again: new_ring retries only what is not done.
  // Queued under mu_ with the ring, so that settled() waits for it.
  auto known = rings_.find(r.epoch);
  if (known == rings_.end() ||
      (known->second.nodes != r.nodes && r.epoch == rings_.rbegin()->first)) {
    tasks_.push_back({Task::kNewRing, r.epoch, -1, {}});
    // After it: the rebuild targets of this epoch made ahead, when its reserve came first
    // (prepare(); else the reserve queues it).
    if (to_prepare_.count(r.epoch)) tasks_.push_back({Task::kPrepare, r.epoch, -1, {}});
    cv_.notify_all();
  }
  rings_[r.epoch] = std::move(r);
}

int SnapshotParity::node_in(int64_t epoch) const {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (auto it = rings_.find(epoch); it != rings_.end()) return it->second.node;
  }
  int node = -1;
  for_each_owned(o_.auth.job, [&](const ckpt::SegmentName& p) {
    if (p.epoch == epoch) node = p.owner_node;  // data: its node; parity: the holder, this one
  });
  return node;
}

int64_t SnapshotParity::newest_held_epoch_below(int64_t epoch) const {
  int64_t newest = -1;
  for_each_owned(o_.auth.job, [&](const ckpt::SegmentName& p) {
    if (p.epoch < epoch) newest = std::max(newest, p.epoch);
  });
  return newest;
}

void SnapshotParity::serve_node_in(ckpt::PeerChannel& ch, const json& h) {
  ch.send({{"ok", true}, {"node", node_in(h.value("epoch", int64_t(-1)))}});
}

void SnapshotParity::serve_ring(ckpt::PeerChannel& ch, const json& h) {
  const std::optional<ReplicaRing> r = ring_of(h.value("epoch", int64_t(-1)));
  if (!r) {
    ch.send({{"ok", false}, {"error", "no ring of that epoch here"}});
    return;
  }
  ch.send({{"ok", true}, {"nodes", r->nodes}});
}

json SnapshotParity::ask_member(int64_t epoch, int node, const json& request, std::string* at) {
  const auto until = std::chrono::steady_clock::now() + kMemberWait;
  for (;;) {
    const std::optional<ReplicaRing> ring = ring_of(epoch);
    if (!ring || node >= int(ring->nodes.size()))
      throw IoError(str("no ring of epoch ", epoch, " here"));
    *at = ring->nodes[size_t(node)];
    std::string failed;
    try {
      return ask(*ring, node, request);
    } catch (const std::exception& e) {
      failed = e.what();
    }
    std::unique_lock<std::mutex> l(mu_);
    const auto now = std::chrono::steady_clock::now();
    if (now >= until) throw IoError(failed);
    // Woken by the same epoch's ring told again (set_ring), a newer epoch, or the stop; else
    // asked again at the same endpoint a little later (its agent may be starting there).
    cv_.wait_until(l, std::min(until, now + std::chrono::milliseconds(250)), [&] {
      if (stopped_ || rings_.rbegin()->first > epoch) return true;
      auto r = rings_.find(epoch);
      return r == rings_.end() || node >= int(r->second.nodes.size()) ||
             r->second.nodes[size_t(node)] != *at;
    });
    if (stopped_) throw IoError("the agent is stopping");
    if (rings_.rbegin()->first > epoch)
      throw IoError(failed + "; and epoch " + std::to_string(epoch) +
                    " is over (a newer ring came)");
  }
}

void SnapshotParity::new_ring(int64_t epoch) {
  std::optional<ReplicaRing> now = ring_of(epoch);
  if (!now) return;
  std::optional<ReplicaRing> old;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (auto it = rings_.lower_bound(epoch); it != rings_.begin()) old = std::prev(it)->second;
  }
  // A restarted agent told only the new ring knows the previous epoch from its segments.
  const int64_t was_epoch = old ? old->epoch : newest_held_epoch_below(epoch);
  if (was_epoch < 0) return;
  const int me_then = old ? old->node : node_in(was_epoch);
  if (me_then < 0) return;  // not a node of that epoch: nothing of it is this node's to rebuild
  const std::string then = str("epoch ", epoch, ": ");
  // Which node of the previous epoch each node of this one was: old index -> new index.
  std::map<int, int> claimed;
  for (int i = 0; i < int(now->nodes.size()); ++i) {
    int was = -1;
    if (i == now->node) {
      was = me_then;
    } else {
      std::string at = now->nodes[size_t(i)];
      try {
        const json r = ask_member(epoch, i, {{"op", "node_in"}, {"epoch", was_epoch}}, &at);
        if (!r.value("ok", false)) throw IoError(r.value("error", std::string("refused")));
        was = r.value("node", -1);
      } catch (const std::exception& e) {
        // Not asked (gone again, or an agent without node_in): its endpoint, if the previous
        // ring names it, is the best left.
        if (old) {
          auto f = std::find(old->nodes.begin(), old->nodes.end(), at);
          if (f != old->nodes.end()) was = int(f - old->nodes.begin());
        }
        log_(str(then, "node ", i, " at ", at, " was not asked which node it was in epoch ",
                 was_epoch, " (", e.what(), "); ",
                 was >= 0 ? str("taken as node ", was, " by its endpoint")
                          : std::string("counted as new")));
      }
    }
    if (was >= 0) claimed.emplace(was, i);
  }
  // The endpoints as told last: a member asked again (ask_member) answered at its new one.
  if (const std::optional<ReplicaRing> told = ring_of(epoch);
      told && told->nodes.size() == now->nodes.size())
    now->nodes = told->nodes;
  if (!old) {
    for (int i = 0; i < int(now->nodes.size()) && !old; ++i) {
      if (i == now->node) continue;
      try {
        const json r = ask(*now, i, {{"op", "ring"}, {"epoch", was_epoch}});
        if (r.value("ok", false) && r.contains("nodes") && r["nodes"].is_array())
          old = ReplicaRing{was_epoch, me_then, r["nodes"].get<std::vector<std::string>>()};
      } catch (const std::exception& e) {
        log_(str(then, "node ", i, " not asked for the ring of epoch ", was_epoch, ": ", e.what()));
      }
    }
    if (!old || me_then >= int(old->nodes.size())) {
      log_(str(then, "this agent holds segments of epoch ", was_epoch, " as its node ", me_then,
               " but no node told it that epoch's ring: nothing of it is rebuilt here"));
      return;
    }
    log_(str(then, "this agent was not told the ring of epoch ", was_epoch,
             " (restarted since?); it was its node ", me_then, " of ", old->nodes.size(),
             " and took the ring from its peers"));
  }
  old->node = me_then;
  std::set<int> gone;
  for (int j = 0; j < int(old->nodes.size()); ++j) {
    auto c = claimed.find(j);
    if (c == claimed.end()) {
      if (j != me_then) gone.insert(j);
      continue;
    }
    std::string& at = old->nodes[size_t(j)];
    const std::string& here = now->nodes[size_t(c->second)];
    if (at != here && j != me_then)
      log_(str(then, "node ", j, " of epoch ", was_epoch, " is node ", c->second, " at ", here,
               " (its agent restarted: epoch ", was_epoch, "'s ring had it at ", at, ")"));
    at = here;  // fetches of the previous epoch's pieces reach it where it is now
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    rings_[was_epoch] = *old;
  }
  gone_[was_epoch] = gone;  // a repair of this epoch's slots asks none of them
  for (int lost : gone)
    if (!losses_done_.count({was_epoch, lost}) && rebuild({Task::kRebuild, was_epoch, lost, gone}))
      losses_done_.insert({was_epoch, lost});
}

}  // namespace weft::launch
