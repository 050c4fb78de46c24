// Replica push and receive between snapshot agents (snapshot_replicas.h).
#include "launch/snapshot_replicas.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/check.h"
#include "base/error.h"
#include "checkpoint/crc32c.h"

namespace weft::launch {

namespace ckpt = checkpoint;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr double kReportSeconds = 10;  // a throughput line at most this often
constexpr auto kRetryAfter = std::chrono::milliseconds(500);  // a failed peer rests this long
constexpr int64_t kMaxCapacity = int64_t(1) << 50;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string mib(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f MiB", bytes / (1 << 20));
  return b;
}

}  // namespace

std::optional<int> ReplicaRing::successor() const {
  const int n = int(nodes.size());
  if (n < 2 || node < 0 || node >= n) return std::nullopt;
  return (node + 1) % n;
}

SnapshotReplicas::SnapshotReplicas(ReplicaOptions o, Log log)
    : o_(std::move(o)), log_(std::move(log)) {}

SnapshotReplicas::~SnapshotReplicas() { stop(); }

void SnapshotReplicas::adopt() {
  adopt_orphans(
      o_.auth.job, {ckpt::SegmentKind::kReplica}, o_.guardian_pid,
      [this](const std::string& name, const ckpt::SegmentName& p,
             std::shared_ptr<ckpt::SnapshotSegment> seg, int was) {
        std::lock_guard<std::mutex> l(mu_);
        held_[name] = {std::move(seg), p.epoch, p.rank, std::make_shared<std::mutex>()};
        log_(str("adopted replica ", name, " (node ", p.owner_node, "'s rank ", p.rank,
                 ", epoch ", p.epoch, ", left by pid ", was, ")"));
      },
      log_);
}

void SnapshotReplicas::set_ring(ReplicaRing r) {
  const std::optional<int> next = r.successor();
  log_(next ? str("epoch ", r.epoch, ": this node is node ", r.node, " of ", r.nodes.size(),
                  "; its snapshots are replicated to node ", *next, " at ", r.nodes[size_t(*next)])
            : str("epoch ", r.epoch, ": this node is node ", r.node, " of ", r.nodes.size(),
                  "; no other node: its snapshots are not replicated in this epoch"));
  std::lock_guard<std::mutex> l(mu_);
  ring_ = std::move(r);
}

std::optional<ReplicaRing> SnapshotReplicas::ring() const {
  std::lock_guard<std::mutex> l(mu_);
  return ring_;
}

void SnapshotReplicas::note_failure(const std::string& peer, const std::string& what) {
  bool stopping = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping = stopped_;
  }
  if (!failing_ && !stopping)
    log_(str("replica push to ", peer, " failed: ", what,
             "; retrying at the next commit (later failures not logged until one "
             "succeeds)"));
  failing_ = true;
  std::shared_ptr<ckpt::PeerChannel> dropped;
  {
    std::lock_guard<std::mutex> l(mu_);
    dropped = std::move(link_);
  }
  retry_at_ = Clock::now() + kRetryAfter;
}

void SnapshotReplicas::push(const CommittedEvent& e) {
  std::optional<ReplicaRing> r;
  std::shared_ptr<ckpt::PeerChannel> link;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopped_ || !ring_) return;
    r = ring_;
    link = link_;
  }
  const std::optional<int> next = r->successor();
  if (!next || e.meta.kind != ckpt::SegmentKind::kData || e.meta.epoch != r->epoch) return;
  const std::string& peer = r->nodes[size_t(*next)];
  const std::optional<ckpt::SnapshotSegment::View> v = newest_unsent(e, r->epoch, pushed_);
  if (!v) return;
  if (link && (link_peer_ != peer || !link->open())) {
    link.reset();
    std::lock_guard<std::mutex> l(mu_);
    link_.reset();
  }
  const bool reused = bool(link);
  if (!link) {
    if (Clock::now() < retry_at_) return;
    try {
      link = ckpt::PeerChannel::connect(peer, o_.auth, r->node, o_.timeout);
    } catch (const std::exception& x) {
      return note_failure(peer, x.what());
    }
    std::lock_guard<std::mutex> l(mu_);
    if (stopped_) return;
    link_ = link;
    link_peer_ = peer;
  }
  const auto t0 = Clock::now();
  try {
    const std::vector<uint32_t> crcs = e.segment->block_crc32c(*v);
    const json header = {{"op", "push"},
                         {"meta", ckpt::to_json(v->meta)},
                         {"capacity", e.segment->capacity()},
                         {"crc32c", crcs}};
    json go;
    try {
      link->send(header);
      go = link->receive();
    } catch (const std::exception&) {
      // The peer's listener closes a connection idle for its timeout (10 s by default): at
      // snapshot intervals longer than that the kept connection is gone by the next commit.
      // A new one, once.
      if (!reused) throw;
      link = ckpt::PeerChannel::connect(peer, o_.auth, r->node, o_.timeout);
      {
        std::lock_guard<std::mutex> l(mu_);
        if (stopped_) return;
        link_ = link;
        link_peer_ = peer;
      }
      link->send(header);
      go = link->receive();
    }
    if (!go.value("ok", false)) {
      // Refused before any payload moved (it does not fit there, an epoch retired there):
      // said once per segment and sequence, not retried until the next commit.
      pushed_[e.name] = v->meta.sequence;
      log_(str("replica push of ", e.name, " step ", v->meta.step, " refused by node ", *next,
               " at ", peer, ": ", go.value("error", std::string("(no reason)"))));
      return;
    }
    link->send_bytes(v->payload, size_t(v->meta.payload_bytes));
    // The slot was read from shared memory while the worker may have begun rewriting it:
    // sent as intact only when its sequence did not change meanwhile.
    const bool intact = e.segment->sequence(v->slot) == v->meta.sequence;
    link->send({{"intact", intact}});
    const json done = link->receive();
    if (!done.value("ok", false)) {
      if (intact)
        log_(str("replica push of ", e.name, " step ", v->meta.step, " not committed at ", peer,
                 ": ", done.value("error", std::string("(no reason)"))));
      ++torn_;
      return;
    }
  } catch (const std::exception& x) {
    return note_failure(peer, x.what());
  }
  const double s = since(t0);
  pushed_[e.name] = v->meta.sequence;
  if (failing_) log_(str("replica push to ", peer, " works again"));
  failing_ = false;
  ++pushes_;
  bytes_ += v->meta.payload_bytes;
  push_s_ += s;
  if (!first_push_logged_) {
    first_push_logged_ = true;
    report_at_ = Clock::now();
    log_(str("first replica pushed: ", e.name, " step ", v->meta.step, " to node ", *next, " at ",
             peer, " (", mib(double(v->meta.payload_bytes)), " in ", s * 1e3, " ms)"));
  }
  if (since(report_at_) >= kReportSeconds) {
    log_(str("replica push: ", pushes_, " snapshot(s), ", mib(double(bytes_)), " to node ", *next,
             " in the last ", since(report_at_), " s; ",
             double(bytes_) / 1e6 / std::max(push_s_, 1e-9), " MB/s while pushing, ",
             push_s_ / double(pushes_) * 1e3, " ms per push",
             torn_ ? str("; ", torn_,
                         " torn (rewritten by the next snapshot while sent: pushes "
                         "are slower than snapshot.every)")
                   : std::string()));
    pushes_ = bytes_ = torn_ = 0;
    push_s_ = 0;
    report_at_ = Clock::now();
  }
}

// ---- receiving -------------------------------------------------------------------------

bool SnapshotReplicas::serve(ckpt::PeerChannel& ch, const json& h) {
  if (h.value("op", std::string()) != "push") return false;
  receive_one(ch, h);
  return true;
}

void SnapshotReplicas::receive_one(ckpt::PeerChannel& ch, const json& h) {
  ckpt::SnapshotMeta m;
  int64_t capacity = 0;
  std::vector<uint32_t> crcs;
  std::string bad;
  try {
    m = ckpt::meta_from_json(h.at("meta"));
    capacity = h.at("capacity").get<int64_t>();
    crcs = h.at("crc32c").get<std::vector<uint32_t>>();
  } catch (const std::exception& e) {
    bad = str("a malformed push header (", e.what(), ")");
  }
  const int64_t blocks =
      (m.payload_bytes + ckpt::kSnapshotBlockBytes - 1) / ckpt::kSnapshotBlockBytes;
  if (bad.empty() && m.job_id != o_.auth.job)
    bad = str("a snapshot of job ", m.job_id, "; this agent serves ", o_.auth.job);
  else if (bad.empty() &&
           (m.kind != ckpt::SegmentKind::kData || m.owner_node < 0 || m.epoch < 0 || m.rank < 0 ||
            m.rank >= m.world || m.payload_bytes < 0 || capacity < m.payload_bytes ||
            capacity > kMaxCapacity || int64_t(crcs.size()) != blocks))
    bad = str("an inconsistent push header (kind ", int(m.kind), ", node ", m.owner_node,
              ", epoch ", m.epoch, ", rank ", m.rank, " of ", m.world, ", ", m.payload_bytes,
              " bytes of ", capacity, ", ", crcs.size(), " checksums)");
  if (!bad.empty()) {
    ch.send({{"ok", false}, {"error", bad}});
    throw IoError(bad);  // a peer that sends such a header is not trusted with more
  }
  std::string why;
  std::optional<Held> held = replica_for(m, capacity, &why);
  if (!held) {
    ch.send({{"ok", false}, {"error", why}});
    return;
  }
  std::lock_guard<std::mutex> writing(*held->writing);
  ch.send({{"ok", true}});
  ckpt::SnapshotMeta rm = m;
  rm.kind = ckpt::SegmentKind::kReplica;
  void* payload = held->segment->begin(rm);  // the slot reads as uncommitted from here on
  ch.receive_bytes(payload, size_t(m.payload_bytes));
  const json trailer = ch.receive();
  if (!trailer.value("intact", false)) {
    ch.send({{"ok", false}, {"error", "rewritten at the source while it was sent: not committed"}});
    return;
  }
  const char* p = static_cast<const char*>(payload);
  int64_t corrupt = 0, first = -1;
  for (int64_t i = 0; i < blocks; ++i) {
    const int64_t len =
        std::min(ckpt::kSnapshotBlockBytes, m.payload_bytes - i * ckpt::kSnapshotBlockBytes);
    if (ckpt::crc32c(p + i * ckpt::kSnapshotBlockBytes, size_t(len)) != crcs[size_t(i)]) {
      if (first < 0) first = i;
      ++corrupt;
    }
  }
  if (corrupt) {
    const std::string msg =
        str(corrupt,
            " block(s) arrived with a checksum that is not the sender's (the first at "
            "byte ",
            first * ckpt::kSnapshotBlockBytes, "): not committed");
    log_(str("replica ", held->segment->name(), " step ", m.step, " from ", ch.peer(), ": ", msg));
    ch.send({{"ok", false}, {"error", msg}});
    return;
  }
  held->segment->commit(crcs);
  ch.send({{"ok", true}, {"step", m.step}});
}

std::optional<SnapshotReplicas::Held> SnapshotReplicas::replica_for(const ckpt::SnapshotMeta& m,
                                                                    int64_t capacity,
                                                                    std::string* why) {
  const std::string name =
      ckpt::segment_name(o_.auth.job, ckpt::SegmentKind::kReplica, m.owner_node, m.epoch, m.rank);
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopped_) {
      *why = "the agent is finishing (the job ended)";
      return std::nullopt;
    }
    if (m.epoch < retired_below_) {
      *why = str("epoch ", m.epoch, " is retired on this node (its snapshots are of epoch ",
                 retired_below_, " or later)");
      return std::nullopt;
    }
    auto it = held_.find(name);
    if (it != held_.end() && it->second.segment->capacity() >= m.payload_bytes) return it->second;
    if (it != held_.end()) {  // the rank's state grew within an epoch: a new segment
      std::lock_guard<std::mutex> w(*it->second.writing);
      ckpt::SnapshotSegment::unlink(name);
      log_(str("removed replica ", name, ": ", it->second.segment->capacity(),
               " bytes per slot, fewer than the ", m.payload_bytes, " pushed"));
      held_.erase(it);
    }
  }
  // A segment of that name this agent does not hold: a dead predecessor's (adopted), or a
  // live agent's on this machine (several nodes on one machine: refused).
  if (std::filesystem::exists("/dev/shm" + name)) {
    try {
      auto seg = std::make_shared<ckpt::SnapshotSegment>(ckpt::SnapshotSegment::open(name, true));
      if (!seg->owner_gone() && seg->owner_pid() != int(::getpid())) {
        *why = str(name, " is held by another live agent (pid ", seg->owner_pid(), ")");
        return std::nullopt;
      }
      if (seg->capacity() >= m.payload_bytes) {
        seg->set_owner(int(::getpid()), o_.guardian_pid);
        std::lock_guard<std::mutex> l(mu_);
        auto [it, fresh] = held_.emplace(
            name, Held{std::move(seg), m.epoch, m.rank, std::make_shared<std::mutex>()});
        (void)fresh;
        return it->second;
      }
    } catch (const std::exception&) {
    }
    ckpt::SnapshotSegment::unlink(name);
  }
  // The memory check of a new replica: the node's free memory less the reserve's margin.
  const double room = snapshot_room(read_node_memory());
  const double need = snapshot_segment_bytes(capacity, 2);
  if (need > room) {
    *why =
        str("a replica of node ", m.owner_node, "'s rank ", m.rank, " (two slots of ",
            mib(double(capacity)), ") does not fit in node memory here (", mib(std::max(0.0, room)),
            " free beyond the margin): set snapshot.redundancy: none "
            "or free memory");
    log_("refused a replica: " + *why);
    return std::nullopt;
  }
  std::shared_ptr<ckpt::SnapshotSegment> seg;
  try {
    // Outside the lock: allocating a large segment takes a while, and `list` must not wait.
    seg = std::make_shared<ckpt::SnapshotSegment>(
        ckpt::SnapshotSegment::create(name, capacity, int(::getpid()), ckpt::kMinSnapshotSlots,
                                      o_.guardian_pid));
  } catch (const std::exception& e) {
    *why = e.what();
    log_("refused a replica: " + *why);
    return std::nullopt;
  }
  std::lock_guard<std::mutex> l(mu_);
  if (stopped_ || m.epoch < retired_below_) {  // finished or retired while it was made
    ckpt::SnapshotSegment::unlink(name);
    *why = "the agent is finishing, or the epoch was retired meanwhile";
    return std::nullopt;
  }
  log_(str("holding replicas of node ", m.owner_node, "'s rank ", m.rank, " (epoch ", m.epoch,
           ") in ", name, ": two slots of ", mib(double(capacity))));
  auto [it, fresh] =
      held_.emplace(name, Held{std::move(seg), m.epoch, m.rank, std::make_shared<std::mutex>()});
  (void)fresh;
  return it->second;
}

std::vector<ckpt::SegmentInfo> SnapshotReplicas::list() const {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<ckpt::SegmentInfo> out;
  for (const auto& [name, x] : held_) {
    ckpt::SegmentInfo s{name,        x.epoch, x.rank, x.segment->capacity(), x.segment->owner_pid(),
                        std::nullopt};
    try {
      if (std::optional<ckpt::SnapshotSegment::View> v = x.segment->latest()) s.committed = v->meta;
    } catch (const std::exception&) {
    }
    out.push_back(std::move(s));
  }
  return out;
}

int64_t SnapshotReplicas::capacity_of_epoch(int64_t epoch) const {
  std::lock_guard<std::mutex> l(mu_);
  int64_t n = 0;
  for (const auto& [name, x] : held_)
    if (x.epoch == epoch) n += x.segment->capacity();
  return n;
}

std::vector<std::string> SnapshotReplicas::retire_older_than(int64_t epoch) {
  std::lock_guard<std::mutex> l(mu_);
  retired_below_ = std::max(retired_below_, epoch);
  std::vector<std::string> out;
  for (auto it = held_.begin(); it != held_.end();) {
    if (it->second.epoch >= epoch) {
      ++it;
      continue;
    }
    ckpt::SnapshotSegment::unlink(it->first);  // a push in flight writes into the unlinked pages
    out.push_back(it->first);
    it = held_.erase(it);
  }
  return out;
}

void SnapshotReplicas::stop() {
  std::shared_ptr<ckpt::PeerChannel> link;
  {
    std::lock_guard<std::mutex> l(mu_);
    stopped_ = true;
    link = link_;
  }
  if (link) link->abort();
}

void SnapshotReplicas::clear() {
  std::lock_guard<std::mutex> l(mu_);
  held_.clear();
}

}  // namespace weft::launch
