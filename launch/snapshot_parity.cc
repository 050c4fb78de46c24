// Erasure-coded snapshots between snapshot agents (snapshot_parity.h).
#include "launch/snapshot_parity.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <future>

#include "base/check.h"
#include "base/error.h"
#include "checkpoint/crc32c.h"

namespace weft::launch {

namespace ckpt = checkpoint;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kMaxFetchBytes = int64_t(1) << 40;
constexpr size_t kStepsKeptAccumulating = 4;  // per stripe: older unfinished steps are dropped
constexpr int kParitySlots = 3;  // as many steps as the data segments keep (docs: "Why the steps meet")

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string mib(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f MiB", bytes / (1 << 20));
  return b;
}

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

int64_t blocks_of(int64_t bytes) {
  return (bytes + ckpt::kSnapshotBlockBytes - 1) / ckpt::kSnapshotBlockBytes;
}

// Whether bytes [from, from + n) of a payload match the rank's block checksums; `data` holds
// them, `from` is block-aligned, `payload` is the rank's whole length.
bool blocks_match(const uint8_t* data, int64_t from, int64_t n, int64_t payload,
                  const std::vector<uint32_t>& crcs) {
  const int64_t B = ckpt::kSnapshotBlockBytes;
  for (int64_t off = 0; off < n; off += B) {
    const int64_t block = (from + off) / B;
    const int64_t len = std::min(B, payload - (from + off));
    if (block >= int64_t(crcs.size()) || len <= 0) return false;
    if (ckpt::crc32c(data + off, size_t(len)) != crcs[size_t(block)]) return false;
  }
  return true;
}

// A parity slot's payload: an 8-byte manifest length, the manifest (JSON), zeros to a page,
// then the parity bytes.
json manifest_of(const ckpt::SnapshotSegment::View& v, int64_t* parity_offset) {
  uint64_t len = 0;
  if (v.meta.payload_bytes < 8) throw IoError("a parity slot without a manifest");
  std::memcpy(&len, v.payload, 8);
  if (int64_t(len) > v.meta.payload_bytes - 8) throw IoError("a parity slot's manifest overruns it");
  const char* p = static_cast<const char*>(v.payload) + 8;
  json m = json::parse(p, p + len);
  *parity_offset = round_up(8 + int64_t(len), 4096);
  return m;
}

// The committed slot of `segment` holding `step` (the newest such), read: bytes [offset,
// offset + length) of its payload into out, zeros past the payload. False when the slot was
// rewritten meanwhile; IoError when no slot holds that step.
bool read_range(const std::string& segment, int64_t step, int64_t offset, int64_t length,
                uint8_t* out) {
  ckpt::SnapshotSegment seg = ckpt::SnapshotSegment::open(segment, false);
  std::optional<ckpt::SnapshotSegment::View> best;
  for (int s = 0; s < seg.slots(); ++s) {
    std::optional<ckpt::SnapshotSegment::View> v = seg.slot(s);
    if (v && v->meta.step == step && (!best || v->meta.sequence > best->meta.sequence)) best = v;
  }
  if (!best) throw IoError(str(segment, " holds no committed snapshot of step ", step));
  const int64_t have = std::clamp<int64_t>(best->meta.payload_bytes - offset, 0, length);
  if (have > 0) std::memcpy(out, static_cast<const uint8_t*>(best->payload) + offset, size_t(have));
  std::memset(out + have, 0, size_t(length - have));
  return seg.sequence(best->slot) == best->meta.sequence;
}

}  // namespace

struct SnapshotParity::Accumulator {
  std::mutex mu;
  int64_t epoch = 0, step = 0;
  int group = 0, number = 0, fragment = 0, k = 0, nodes = 0, me = 0;
  std::vector<uint8_t> parity;  // this node's parity row of the stripe, fragment - k
  json members = json::object();             // "t" -> {meta, crc32c, chunk}
  bool done = false;
};

SnapshotParity::SnapshotParity(ParityOptions o, Log log)
    : o_(std::move(o)), log_(std::move(log)), worker_([this] { work(); }) {
  code(o_.k);  // ConfigError now, not at the first chunk
}

SnapshotParity::~SnapshotParity() { stop(); }

const ckpt::ErasureCode& SnapshotParity::code(int k) const {
  std::lock_guard<std::mutex> l(codes_mu_);
  auto& c = codes_[k];
  if (!c) c = std::make_unique<ckpt::ErasureCode>(k, o_.m);
  return *c;
}

std::optional<ReplicaRing> SnapshotParity::ring_of(int64_t epoch) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = rings_.find(epoch);
  if (it == rings_.end()) return std::nullopt;
  return it->second;
}

void SnapshotParity::adopt() {
  adopt_orphans(
      o_.auth.job, {ckpt::SegmentKind::kParity, ckpt::SegmentKind::kRebuilt}, o_.guardian_pid,
      [this](const std::string& name, const ckpt::SegmentName& p,
             std::shared_ptr<ckpt::SnapshotSegment> seg, int was) {
        std::lock_guard<std::mutex> l(mu_);
        (p.kind == ckpt::SegmentKind::kParity ? parity_ : rebuilt_)[name] = std::move(seg);
        log_(str("adopted ", name, " (left by pid ", was, ")"));
      },
      log_);
}

// ---- pushing: the data side -------------------------------------------------------------

std::shared_ptr<ckpt::PeerChannel> SnapshotParity::channel(const ReplicaRing& ring, int node,
                                                           Links& cache, bool* reused) {
  const std::string& peer = ring.nodes.at(size_t(node));
  if (reused) *reused = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopped_) throw IoError("the agent is stopping");
    auto it = cache.find(peer);
    if (it != cache.end() && it->second->open()) {
      if (reused) *reused = true;
      return it->second;
    }
  }
  std::shared_ptr<ckpt::PeerChannel> ch =
      ckpt::PeerChannel::connect(peer, o_.auth, ring.node, o_.timeout);
  std::lock_guard<std::mutex> l(mu_);
  cache[peer] = ch;
  return ch;
}

void SnapshotParity::drop(Links& cache, const std::string& endpoint) {
  std::lock_guard<std::mutex> l(mu_);
  cache.erase(endpoint);
}

json SnapshotParity::call(const ReplicaRing& ring, int node, Links& cache, const json& request,
                          std::shared_ptr<ckpt::PeerChannel>* used) {
  const std::string& peer = ring.nodes.at(size_t(node));
  for (int attempt = 0;; ++attempt) {
    bool reused = false;
    std::shared_ptr<ckpt::PeerChannel> ch = channel(ring, node, cache, &reused);
    try {
      ch->send(request);
      json reply = ch->receive();
      *used = std::move(ch);
      return reply;
    } catch (...) {
      drop(cache, peer);
      if (!reused || attempt > 0) throw;
    }
  }
}

void SnapshotParity::push(const CommittedEvent& e) {
  if (e.meta.kind != ckpt::SegmentKind::kData || e.local < 0) return;
  const std::optional<ReplicaRing> ring = ring_of(e.meta.epoch);
  if (!ring) return;
  const int n = int(ring->nodes.size());
  if (n < o_.k + o_.m) return;  // said by set_ring
  const std::optional<ckpt::SnapshotSegment::View> v = newest_unsent(e, ring->epoch, pushed_);
  if (!v) return;
  const ckpt::StripeLayout layout(n, o_.k, o_.m);
  const int K = layout.data_fragments(layout.group_of(ring->node));
  const int64_t payload = v->meta.payload_bytes, c = ckpt::chunk_bytes(payload, K);
  const std::vector<uint32_t> crcs = e.segment->block_crc32c(*v);
  const auto t0 = Clock::now();
  bool all = true;
  int64_t sent = 0;
  for (int t = 0; t < K; ++t) {
    const ckpt::StripeId s = layout.stripe_of_chunk(ring->node, e.local, t);
    for (int j = 0; j < o_.m; ++j) {
      const int holder = layout.fragment_node(s, K + j);
      const std::string& peer = ring->nodes[size_t(holder)];
      const int64_t real = std::clamp<int64_t>(payload - t * c, 0, c);
      try {
        std::shared_ptr<ckpt::PeerChannel> ch;
        const json go = call(*ring, holder, push_links_,
                             {{"op", "chunk"},
                              {"meta", ckpt::to_json(v->meta)},
                              {"crc32c", crcs},
                              {"group", s.group},
                              {"stripe", layout.number(s)},
                              {"fragment", t},
                              {"chunk", c}},
                             &ch);
        try {
          if (!go.value("ok", false)) {
            all = false;
            if (failing_.insert(peer + "/refused").second)
              log_(str("parity chunk of ", e.name, " step ", v->meta.step, " refused by node ",
                       holder, " at ", peer, ": ", go.value("error", std::string("(no reason)")),
                       " (later refusals not logged until one is taken)"));
            continue;
          }
          if (real > 0) ch->send_bytes(static_cast<const uint8_t*>(v->payload) + t * c, size_t(real));
          const bool intact = e.segment->sequence(v->slot) == v->meta.sequence;
          ch->send({{"intact", intact}});
          const json done = ch->receive();
          if (!done.value("ok", false)) {
            all = false;
            // Torn (rewritten while sent): the next commit sends anew. Else the holder took
            // the chunk but did not keep the stripe's parity: said once until one is kept.
            if (!done.value("torn", false) && failing_.insert(peer + "/refused").second)
              log_(str("parity chunk of ", e.name, " step ", v->meta.step, " refused by node ",
                       holder, " at ", peer, ": ", done.value("error", std::string("(no reason)")),
                       "; this step of it is not protected (later refusals not logged until "
                       "one is taken)"));
            continue;
          }
          sent += real;
          if (failing_.erase(peer) + failing_.erase(peer + "/refused"))
            log_(str("parity chunks to ", peer, " are taken again"));
        } catch (...) {
          drop(push_links_, peer);
          throw;
        }
      } catch (const std::exception& x) {
        all = false;
        if (failing_.insert(peer).second)
          log_(str("parity chunk to node ", holder, " at ", peer, " failed: ", x.what(),
                   "; retrying at the next commit (later failures not logged until one "
                   "succeeds)"));
      }
    }
  }
  if (!all) return;
  const bool first = pushed_.empty();
  pushed_[e.name] = v->meta.sequence;
  if (first)
    log_(str("first parity chunks sent: ", e.name, " step ", v->meta.step, ", ", K, " chunk(s) of ",
             mib(double(c)), " to ", K * o_.m, " holder(s), ", mib(double(sent)), " in ",
             since(t0) * 1e3, " ms; later ones are not logged"));
}

// ---- receiving: the parity holder -------------------------------------------------------

bool SnapshotParity::serve(ckpt::PeerChannel& ch, const json& h) {
  const std::string op = h.value("op", std::string());
  if (op == "chunk")
    serve_chunk(ch, h);
  else if (op == "stripe")
    serve_stripe(ch, h);
  else if (op == "fetch")
    serve_fetch(ch, h);
  else if (op == "node_in")
    serve_node_in(ch, h);
  else if (op == "ring")
    serve_ring(ch, h);
  else
    return false;
  return true;
}

void SnapshotParity::serve_chunk(ckpt::PeerChannel& ch, const json& h) {
  ckpt::SnapshotMeta meta;
  std::vector<uint32_t> crcs;
  int group = 0, number = 0, t = 0;
  int64_t c = 0;
  std::string bad;
  try {
    meta = ckpt::meta_from_json(h.at("meta"));
    crcs = h.at("crc32c").get<std::vector<uint32_t>>();
    group = h.at("group").get<int>();
    number = h.at("stripe").get<int>();
    t = h.at("fragment").get<int>();
    c = h.at("chunk").get<int64_t>();
  } catch (const std::exception& e) {
    bad = str("a malformed chunk header (", e.what(), ")");
  }
  std::optional<ReplicaRing> ring;
  std::optional<ckpt::StripeLayout> layout;
  ckpt::StripeId s;
  int K = 0, f = -1;
  if (bad.empty() && meta.job_id != o_.auth.job)
    bad = str("a chunk of job ", meta.job_id, "; this agent serves ", o_.auth.job);
  if (bad.empty() && !(ring = ring_of(meta.epoch))) {
    // Each node's weft run tells its own agent the ring: a data node may have it a moment
    // before this holder, and a refused chunk is sent again only at its node's next commit.
    // Waited for until kRingWait after the first such chunk of the epoch, not longer (a
    // holder that never gets it does not slow every push).
    {
      std::unique_lock<std::mutex> l(mu_);
      const auto until = ring_wait_until_.emplace(meta.epoch, Clock::now() + kRingWait).first->second;
      cv_.wait_until(l, until, [&] { return stopped_ || rings_.count(meta.epoch) > 0; });
    }
    if (!(ring = ring_of(meta.epoch))) bad = str("no ring of epoch ", meta.epoch, " here yet");
  }
  if (bad.empty()) {
    try {
      layout.emplace(int(ring->nodes.size()), o_.k, o_.m);
      if (group < 0 || group >= layout->groups() || layout->group_of(ring->node) != group)
        throw IoError(str("group ", group, " is not this node's"));
      K = layout->data_fragments(group);
      s = layout->stripe_numbered(group, number);
      if (number < 0 || s.rotation < 0 || t < 0 || t >= K ||
          layout->fragment_node(s, t) != meta.owner_node)
        throw IoError(str("node ", meta.owner_node, " is not data fragment ", t, " of stripe ",
                          number));
      for (int j = 0; j < o_.m; ++j)
        if (layout->fragment_node(s, K + j) == ring->node) f = K + j;
      if (f < 0) throw IoError(str("this node holds no parity of stripe ", number));
      if (c != ckpt::chunk_bytes(meta.payload_bytes, K) ||
          int64_t(crcs.size()) != blocks_of(meta.payload_bytes))
        throw IoError("chunk length or checksums do not match the payload");
    } catch (const std::exception& e) {
      bad = str("an inconsistent chunk (", e.what(), ")");
    }
  }
  if (!bad.empty()) {
    ch.send({{"ok", false}, {"error", bad}});
    return;
  }
  ch.send({{"ok", true}});
  const int64_t real = std::clamp<int64_t>(meta.payload_bytes - t * c, 0, c);
  std::vector<uint8_t> buf(size_t(c), 0);
  if (real > 0) ch.receive_bytes(buf.data(), size_t(real));
  const json trailer = ch.receive();
  if (!trailer.value("intact", false)) {
    ch.send({{"ok", false}, {"torn", true}, {"error", "rewritten at the source while it was sent"}});
    return;
  }
  if (!blocks_match(buf.data(), t * c, real, meta.payload_bytes, crcs)) {
    log_(str("a parity chunk of node ", meta.owner_node, "'s rank ", meta.rank, " step ", meta.step,
             " arrived with checksums that are not the sender's: not used"));
    ch.send({{"ok", false}, {"error", "checksum mismatch on arrival"}});
    return;
  }
  const std::string key = str(meta.epoch, "/", number, "/", meta.step);
  std::shared_ptr<Accumulator> a;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopped_ || meta.epoch < retired_below_) {
      ch.send({{"ok", false}, {"error", "the epoch is retired here, or the agent is stopping"}});
      return;
    }
    auto& slot = accumulating_[key];
    if (!slot) {
      slot = std::make_shared<Accumulator>();
      slot->epoch = meta.epoch;
      slot->step = meta.step;
      slot->group = group;
      slot->number = number;
      slot->fragment = f;
      slot->k = K;
      slot->nodes = int(ring->nodes.size());
      slot->me = ring->node;
      slot->parity.clear();
      // Bounded: a stripe whose chunks of a step never all arrive (a member died) keeps
      // its newest few steps only.
      std::vector<std::string> same;
      const std::string prefix = str(meta.epoch, "/", number, "/");
      for (const auto& [k2, x] : accumulating_)
        if (k2.starts_with(prefix)) same.push_back(k2);
      std::sort(same.begin(), same.end(), [&](const std::string& x, const std::string& y) {
        return accumulating_[x]->step < accumulating_[y]->step;
      });
      for (size_t i = 0; i + kStepsKeptAccumulating < same.size(); ++i) accumulating_.erase(same[i]);
    }
    a = accumulating_.count(key) ? accumulating_[key] : nullptr;
  }
  if (!a) {
    ch.send({{"ok", true}});  // dropped as too old: the newer steps matter
    return;
  }
  bool complete = false;
  std::string not_kept;
  {
    std::lock_guard<std::mutex> l(a->mu);
    if (!a->done && !a->members.contains(std::to_string(t))) {
      if (int64_t(a->parity.size()) < c) a->parity.resize(size_t(c), 0);
      code(K).encode_update(t, buf.data(), {a->parity.data()}, size_t(c), a->fragment - a->k);
      a->members[std::to_string(t)] = {{"meta", ckpt::to_json(meta)}, {"crc32c", crcs}, {"chunk", c}};
      if (int(a->members.size()) == K) {
        not_kept = commit_parity(a->epoch, a->me, a->number, a->step, *a);
        a->done = complete = true;
      }
    }
  }
  if (complete) {
    std::lock_guard<std::mutex> l(mu_);
    const std::string prefix = str(meta.epoch, "/", number, "/");
    for (auto it = accumulating_.begin(); it != accumulating_.end();)
      it = it->first.starts_with(prefix) && it->second->step <= meta.step ? accumulating_.erase(it)
                                                                          : std::next(it);
  }
  // The chunk that completed the stripe hears whether its parity was kept: a data node is
  // told that a step of its is not protected (it logs it), not left to believe it is.
  if (!not_kept.empty()) {
    ch.send({{"ok", false}, {"error", not_kept}});
    return;
  }
  ch.send({{"ok", true}});
}

// Called with a->mu held: writes the stripe's parity of a step into this node's parity
// segment of the stripe (made, or remade larger, on demand). Returns "" when it is kept,
// else why not (no room in node memory here, or the segment could not be made).
std::string SnapshotParity::commit_parity(int64_t epoch, int me, int number, int64_t step,
                                          Accumulator& a) {
  const std::vector<uint8_t>& row = a.parity;
  const json manifest = {{"group", a.group}, {"stripe", number},      {"k", a.k},
                         {"m", o_.m},         {"fragment", a.fragment}, {"length", row.size()},
                         {"members", a.members}};
  const std::string text = manifest.dump();
  const int64_t offset = round_up(8 + int64_t(text.size()), 4096);
  const int64_t payload = offset + int64_t(row.size());
  const std::string name = ckpt::segment_name(o_.auth.job, ckpt::SegmentKind::kParity, me, epoch, number);
  std::lock_guard<std::mutex> w(writing_);
  std::shared_ptr<ckpt::SnapshotSegment> seg;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (auto it = parity_.find(name); it != parity_.end()) seg = it->second;
  }
  if (seg && seg->capacity() < payload) {
    ckpt::SnapshotSegment::unlink(name);
    seg.reset();
  }
  if (!seg) {
    // The reserve counted this parity in its check; memory may have gone since. A segment
    // that does not fit is not made (the agent allocates every page of it at once).
    const double room = snapshot_room(read_node_memory()),
                 need = snapshot_segment_bytes(payload + 4096, kParitySlots);
    if (need > room) {
      const std::string why =
          str("parity of stripe ", number, " (epoch ", epoch, ", step ", step, ") not kept on node ",
              me, ": ", mib(need), " do not fit in node memory there (", mib(std::max(0.0, room)),
              " free beyond the margin; snapshot.every: 0, more nodes, or free memory)");
      if (room_refused_.insert(name).second)
        log_(why + "; later refusals of it are not logged");
      return why;
    }
    try {
      // Room for a manifest somewhat longer than this one (checksums of a grown state).
      seg = std::make_shared<ckpt::SnapshotSegment>(ckpt::SnapshotSegment::create(
          name, payload + 4096, int(::getpid()), kParitySlots, o_.guardian_pid));
    } catch (const std::exception& e) {
      const std::string why =
          str("parity of stripe ", number, " (epoch ", epoch, ", step ", step, ") not kept on node ",
              me, ": ", e.what());
      log_(why);
      return why;
    }
    log_(str("holding parity fragment ", a.fragment, " of stripe ", number, " (epoch ", epoch, ") in ",
             name, ": ", kParitySlots, " slots of ", mib(double(payload))));
    std::lock_guard<std::mutex> l(mu_);
    parity_[name] = seg;
  }
  ckpt::SnapshotMeta m;
  m.job_id = o_.auth.job;
  m.kind = ckpt::SegmentKind::kParity;
  m.owner_node = me;
  m.epoch = epoch;
  m.step = step;
  m.rank = number;
  m.world = a.nodes;
  m.payload_bytes = payload;
  auto* p = static_cast<uint8_t*>(seg->begin(m));
  const uint64_t len = text.size();
  std::memcpy(p, &len, 8);
  std::memcpy(p + 8, text.data(), text.size());
  std::memset(p + 8 + text.size(), 0, size_t(offset - 8 - int64_t(text.size())));
  std::memcpy(p + offset, row.data(), row.size());
  seg->commit();
  if (room_refused_.erase(name))
    log_(str("parity of stripe ", number, " (epoch ", epoch, ") is kept again from step ", step));
  return {};
}

std::vector<SnapshotParity::StripeSlot> SnapshotParity::stripe_slots_here(int64_t epoch,
                                                                          int number) const {
  std::shared_ptr<ckpt::SnapshotSegment> seg;
  int holder = -1;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& [name, s] : parity_) {
      const std::optional<ckpt::SegmentName> p = ckpt::parse_segment_name(name);
      if (p && p->epoch == epoch && p->rank == number) {
        seg = s;
        holder = p->owner_node;
      }
    }
  }
  std::vector<StripeSlot> out;
  if (!seg) return out;
  for (int i = 0; i < seg->slots(); ++i) {
    try {
      std::optional<ckpt::SnapshotSegment::View> v = seg->slot(i);
      if (!v) continue;
      StripeSlot s;
      s.holder = holder;
      s.step = v->meta.step;
      s.manifest = manifest_of(*v, &s.parity_offset);
      if (seg->sequence(v->slot) == v->meta.sequence) out.push_back(std::move(s));
    } catch (const std::exception&) {
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.step > b.step; });
  return out;
}

void SnapshotParity::serve_stripe(ckpt::PeerChannel& ch, const json& h) {
  json slots = json::array();
  for (const StripeSlot& s :
       stripe_slots_here(h.value("epoch", int64_t(-1)), h.value("stripe", -1)))
    slots.push_back({{"step", s.step}, {"manifest", s.manifest}, {"parity_offset", s.parity_offset}});
  ch.send({{"ok", true}, {"slots", slots}});
}

void SnapshotParity::serve_fetch(ckpt::PeerChannel& ch, const json& h) {
  const std::string name = h.value("segment", std::string());
  const int64_t step = h.value("step", int64_t(-1)), offset = h.value("offset", int64_t(-1)),
                length = h.value("length", int64_t(-1));
  const std::optional<ckpt::SegmentName> p = ckpt::parse_segment_name(name);
  if (!p || p->job_id != o_.auth.job || offset < 0 || length < 0 || length > kMaxFetchBytes) {
    ch.send({{"ok", false}, {"error", "bad fetch: a segment of this job, offset and length >= 0"}});
    return;
  }
  std::vector<uint8_t> buf(static_cast<size_t>(length));
  bool intact = false;
  try {
    intact = read_range(name, step, offset, length, buf.data());
  } catch (const std::exception& e) {
    ch.send({{"ok", false}, {"error", e.what()}});
    return;
  }
  ch.send({{"ok", true}});
  ch.send_bytes(buf.data(), buf.size());
  ch.send({{"intact", intact}});
}

// ---- rebuilding and repairing ---------------------------------------------------------------

void SnapshotParity::repair() {
  std::lock_guard<std::mutex> l(mu_);
  for (const Task& t : tasks_)
    if (t.kind == Task::kRepair) return;  // one queued is enough: it checks everything
  tasks_.push_back({Task::kRepair, 0, -1, {}});
  cv_.notify_all();
}

bool SnapshotParity::settled(int64_t epoch) const {
  std::lock_guard<std::mutex> l(mu_);
  return !rings_.empty() && rings_.rbegin()->first >= epoch && tasks_.empty() && !working_;
}

void SnapshotParity::work() {
  for (;;) {
    Task t;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stopped_ || !tasks_.empty(); });
      if (stopped_) return;
      t = tasks_.front();
      tasks_.pop_front();
      working_ = true;
    }
    try {
      if (t.kind == Task::kRebuild)
        rebuild(t);
      else if (t.kind == Task::kNewRing)
        new_ring(t.epoch);
      else
        repair_now();
    } catch (const std::exception& e) {
      log_(str(t.kind == Task::kRepair ? "repair" : "rebuild", " failed: ", e.what()));
    }
    std::vector<std::vector<uint8_t>>().swap(scratch_);  // its memory back between tasks
    std::lock_guard<std::mutex> l(mu_);
    working_ = false;
  }
}

json SnapshotParity::ask(const ReplicaRing& ring, int node, const json& request) {
  std::shared_ptr<ckpt::PeerChannel> ch;
  return call(ring, node, fetch_links_, request, &ch);
}

void SnapshotParity::fetch(const ReplicaRing& ring, int node, const std::string& segment,
                           int64_t step, int64_t offset, int64_t length, uint8_t* out) {
  if (node == ring.node) {
    if (!read_range(segment, step, offset, length, out))
      throw IoError(str(segment, " step ", step, " was rewritten while read"));
    return;
  }
  const std::string& peer = ring.nodes.at(size_t(node));
  std::shared_ptr<ckpt::PeerChannel> ch;
  const json r = call(ring, node, fetch_links_,
                      {{"op", "fetch"}, {"segment", segment}, {"step", step}, {"offset", offset},
                       {"length", length}},
                      &ch);
  try {
    if (!r.value("ok", false))
      throw IoError(str("node ", node, " at ", peer, ": ", r.value("error", std::string("refused"))));
    ch->receive_bytes(out, size_t(length));
    if (!ch->receive().value("intact", false))
      throw IoError(str(segment, " step ", step, " was rewritten at node ", node, " while fetched"));
  } catch (const IoError&) {
    throw;
  } catch (...) {
    drop(fetch_links_, peer);
    throw;
  }
}

std::vector<SnapshotParity::StripeSlot> SnapshotParity::stripe_slots(
    const ReplicaRing& ring, const ckpt::StripeLayout& l, const ckpt::StripeId& s,
    const std::set<int>& gone) {
  std::vector<StripeSlot> out;
  const int K = l.data_fragments(s.group);
  for (int j = 0; j < o_.m; ++j) {
    const int holder = l.fragment_node(s, K + j);
    if (gone.count(holder)) continue;
    try {
      if (holder == ring.node) {
        for (StripeSlot& x : stripe_slots_here(ring.epoch, l.number(s))) out.push_back(std::move(x));
        continue;
      }
      const json r = ask(ring, holder, {{"op", "stripe"}, {"epoch", ring.epoch}, {"stripe", l.number(s)}});
      for (const json& x : r.value("slots", json::array()))
        out.push_back({holder, x.at("step").get<int64_t>(), x.at("manifest"),
                       x.at("parity_offset").get<int64_t>()});
    } catch (const std::exception& e) {
      log_(str("parity holder node ", holder, " of stripe ", l.number(s), " not asked: ", e.what()));
    }
  }
  return out;
}

void SnapshotParity::decode_fragment(const ReplicaRing& ring, const ckpt::StripeLayout& l,
                                     const ckpt::StripeId& s, int lost,
                                     const std::vector<StripeSlot>& at_step,
                                     const std::set<int>& gone, uint8_t* out, int64_t out_len) {
  WEFT_CHECK(!at_step.empty(), "decode_fragment without a parity slot");
  const int K = l.data_fragments(s.group), n = K + o_.m;
  const json& manifest = at_step.front().manifest;
  const int64_t L = manifest.at("length").get<int64_t>(), step = at_step.front().step;
  WEFT_CHECK(out_len >= 0 && out_len <= L, "decode_fragment: ", out_len, " bytes asked of a ",
             L, "-byte fragment");
  std::vector<int> erased;
  for (int f = 0; f < n; ++f) {
    const bool have_parity =
        f < K || std::any_of(at_step.begin(), at_step.end(),
                             [&](const StripeSlot& x) { return x.holder == l.fragment_node(s, f); });
    if (f == lost || gone.count(l.fragment_node(s, f)) || !have_parity) erased.push_back(f);
  }
  if (int(erased.size()) > o_.m)
    throw IoError(str("stripe ", l.number(s), " step ", step, ": ", erased.size(),
                      " of its fragments are lost or without that step; at most ", o_.m,
                      " can be rebuilt"));
  // ErasureCode reads the first K fragments not erased: fetch exactly those, each from its
  // node at the same time (they are on distinct nodes: one connection each).
  struct Source {
    int f = 0, node = 0;
    std::string segment;
    int64_t offset = 0, length = 0;  // where fragment f's bytes lie in the segment's slot
  };
  std::vector<Source> sources;
  for (int f = 0; f < n && int(sources.size()) < K; ++f) {
    if (std::find(erased.begin(), erased.end(), f) != erased.end()) continue;
    Source x{f, l.fragment_node(s, f), "", 0, L};
    if (f < K) {
      const json& member = manifest.at("members").at(std::to_string(f));
      const ckpt::SnapshotMeta m = ckpt::meta_from_json(member.at("meta"));
      const int64_t c = member.at("chunk").get<int64_t>();
      x.segment = ckpt::segment_name(o_.auth.job, ckpt::SegmentKind::kData, m.owner_node, m.epoch, m.rank);
      x.offset = f * c;
      x.length = std::min(c, L);
    } else {
      const StripeSlot& y = *std::find_if(at_step.begin(), at_step.end(),
                                          [&](const StripeSlot& z) { return z.holder == x.node; });
      x.segment = ckpt::segment_name(o_.auth.job, ckpt::SegmentKind::kParity, x.node, ring.epoch, l.number(s));
      x.offset = y.parity_offset;
    }
    sources.push_back(std::move(x));
  }
  // Piece by piece, in two sets of small buffers reused throughout: piece i + 1 is fetched
  // while piece i decodes, and the lost fragment decodes straight into `out`. (It used to
  // fetch whole fragments into K + m fresh buffers of a chunk each and copy the result: at
  // 727 MiB a rank, touching that scratch's new pages was a large part of the rebuild.)
  const int64_t P = std::min<int64_t>(kDecodePieceBytes, std::max<int64_t>(L, 1));
  std::vector<std::vector<uint8_t>>& bufs = scratch_;
  bufs.resize(2 * static_cast<size_t>(n));
  for (auto& b : bufs)
    if (int64_t(b.size()) < P) b.resize(size_t(P));
  auto fetch_piece = [&](int64_t o, int set) {
    std::vector<std::future<void>> f;
    const int64_t piece = std::min(P, L - o);
    for (const Source& x : sources) {
      uint8_t* buf = bufs[size_t(set * n + x.f)].data();
      const int64_t have = std::clamp<int64_t>(x.length - o, 0, piece);
      f.push_back(std::async(std::launch::async, [=, this, &ring] {
        if (have > 0) fetch(ring, x.node, x.segment, step, x.offset + o, have, buf);
        std::memset(buf + have, 0, size_t(piece - have));  // a short fragment's zero padding
      }));
    }
    return f;
  };
  auto wait_all = [](std::vector<std::future<void>>& f) {
    std::exception_ptr failed;
    for (auto& x : f) {
      try {
        x.get();
      } catch (...) {
        if (!failed) failed = std::current_exception();
      }
    }
    f.clear();
    if (failed) std::rethrow_exception(failed);
  };
  std::vector<std::future<void>> pending;
  if (out_len > 0) pending = fetch_piece(0, 0);
  for (int64_t o = 0, set = 0; o < out_len; o += P, set ^= 1) {
    wait_all(pending);
    if (o + P < out_len) pending = fetch_piece(o + P, int(set ^ 1));
    const int64_t piece = std::min(P, L - o), direct = std::min(piece, out_len - o);
    std::vector<uint8_t*> ptrs;
    for (int f = 0; f < n; ++f) ptrs.push_back(bufs[size_t(set * n + f)].data());
    if (direct == piece) ptrs[size_t(lost)] = out + o;
    code(K).reconstruct(ptrs, erased, size_t(piece));
    if (direct < piece) std::memcpy(out + o, ptrs[size_t(lost)], size_t(direct));
  }
}

namespace {
// The node's own data segments of an epoch, by rank (the local ranks' order).
std::vector<std::string> own_data(const std::string& job, int node, int64_t epoch) {
  std::vector<std::pair<int, std::string>> found;
  for (const std::string& name : ckpt::snapshot_segments(job)) {
    const std::optional<ckpt::SegmentName> p = ckpt::parse_segment_name(name);
    if (p && p->kind == ckpt::SegmentKind::kData && p->owner_node == node && p->epoch == epoch)
      found.push_back({p->rank, name});
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [rank, name] : found) out.push_back(std::move(name));
  return out;
}
}  // namespace

bool SnapshotParity::rebuild(const Task& task) {
  const std::optional<ReplicaRing> ring = ring_of(task.epoch);
  if (!ring || int(ring->nodes.size()) < o_.k + o_.m) return true;
  const ckpt::StripeLayout l(int(ring->nodes.size()), o_.k, o_.m);
  const int g = l.group_of(task.lost);
  if (l.group_of(ring->node) != g) return true;
  // The first surviving node after the lost one in its group rebuilds it.
  int designated = -1;
  for (int d = 1; d < l.group_size(g) && designated < 0; ++d) {
    const int cand = l.node_at(g, l.position(task.lost) + d);
    if (!task.gone.count(cand)) designated = cand;
  }
  if (designated != ring->node) return true;
  const int K = l.data_fragments(g);
  const int lost_here = int(std::count_if(task.gone.begin(), task.gone.end(),
                                          [&](int n) { return l.group_of(n) == g; }));
  if (lost_here > o_.m) {
    log_(str("node ", task.lost, " of epoch ", task.epoch, " is lost with ", lost_here - 1,
             " other(s) of its group: ", lost_here, " nodes, more than m = ", o_.m,
             ", so its snapshots could not be rebuilt from parity (a recovery takes what "
             "survives, else the durable checkpoint)"));
    return false;
  }
  const int locals = int(own_data(o_.auth.job, ring->node, task.epoch).size());
  log_(str("node ", task.lost, " of epoch ", task.epoch, " is lost: rebuilding its ", locals,
           " rank(s)' snapshots from parity"));
  bool all = true;
  for (int local = 0; local < locals; ++local) {
    const auto t0 = Clock::now();
    std::vector<ckpt::StripeId> stripes;
    std::vector<std::vector<StripeSlot>> slots;
    std::set<int64_t> steps;
    for (int t = 0; t < K; ++t) {
      stripes.push_back(l.stripe_of_chunk(task.lost, local, t));
      slots.push_back(stripe_slots(*ring, l, stripes.back(), task.gone));
      std::set<int64_t> here;
      for (const StripeSlot& x : slots.back()) here.insert(x.step);
      if (t == 0) {
        steps = here;
      } else {
        std::set<int64_t> both;
        for (int64_t s : steps)
          if (here.count(s)) both.insert(s);
        steps = both;
      }
    }
    const double ask_s = since(t0);
    bool done = false;
    for (auto it = steps.rbegin(); it != steps.rend() && !done; ++it) {
      const int64_t step = *it;
      try {
        const auto t1 = Clock::now();
        std::vector<std::vector<StripeSlot>> at(static_cast<size_t>(K));
        for (int t = 0; t < K; ++t)
          for (const StripeSlot& x : slots[size_t(t)])
            if (x.step == step) at[size_t(t)].push_back(x);
        const json& me = at[0].front().manifest.at("members").at("0");
        ckpt::SnapshotMeta meta = ckpt::meta_from_json(me.at("meta"));
        const std::vector<uint32_t> crcs = me.at("crc32c").get<std::vector<uint32_t>>();
        const int64_t c = me.at("chunk").get<int64_t>(), payload = meta.payload_bytes;
        const std::string name = ckpt::segment_name(o_.auth.job, ckpt::SegmentKind::kRebuilt,
                                                    task.lost, task.epoch, meta.rank);
        std::shared_ptr<ckpt::SnapshotSegment> seg;
        {
          std::lock_guard<std::mutex> lk(mu_);
          if (auto f = rebuilt_.find(name); f != rebuilt_.end()) seg = f->second;
        }
        if (seg && seg->capacity() < payload) {
          ckpt::SnapshotSegment::unlink(name);
          seg.reset();
        }
        if (!seg) {
          ckpt::SnapshotSegment::unlink(name);  // a half-made one of an earlier try
          seg = std::make_shared<ckpt::SnapshotSegment>(
              ckpt::SnapshotSegment::create(name, std::max<int64_t>(payload, 1), int(::getpid()),
                                            ckpt::kMinSnapshotSlots, o_.guardian_pid));
          std::lock_guard<std::mutex> lk(mu_);
          rebuilt_[name] = seg;
        }
        meta.kind = ckpt::SegmentKind::kRebuilt;
        auto* out = static_cast<uint8_t*>(seg->begin(meta));
        for (int t = 0; t < K; ++t) {
          // Chunk t of the lost rank is data fragment t of its t-th stripe.
          const int64_t n = std::clamp<int64_t>(payload - t * c, 0, c);
          if (n > 0) decode_fragment(*ring, l, stripes[size_t(t)], t, at[size_t(t)], task.gone, out + t * c, n);
        }
        if (!blocks_match(out, 0, payload, payload, crcs))
          throw IoError("the decoded bytes do not match the rank's checksums");
        seg->commit(crcs);
        log_(str("rebuilt node ", task.lost, "'s rank ", meta.rank, " (epoch ", task.epoch, ", step ",
                 step, ") from parity into ", name, ": ", mib(double(payload)), " in ",
                 since(t0) * 1e3, " ms (asking the holders ", ask_s * 1e3, " ms, fetch and decode ",
                 since(t1) * 1e3, " ms)"));
        done = true;
      } catch (const std::exception& e) {
        log_(str("node ", task.lost, "'s local rank ", local, " not rebuilt at step ", step, ": ",
                 e.what()));
      }
    }
    if (!done)
      log_(str("node ", task.lost, "'s local rank ", local, " (epoch ", task.epoch,
               ") could not be rebuilt from parity: no step has every stripe's fragments"));
    all = all && done;
  }
  return all;
}

void SnapshotParity::repair_now() {
  std::map<int64_t, ReplicaRing> rings;
  {
    std::lock_guard<std::mutex> l(mu_);
    rings = rings_;
  }
  for (const auto& [epoch, ring] : rings) {
    const std::vector<std::string> own = own_data(o_.auth.job, ring.node, epoch);
    for (int local = 0; local < int(own.size()); ++local) {
      ckpt::SnapshotSegment seg = ckpt::SnapshotSegment::open(own[size_t(local)], true);
      for (int slot = 0; slot < seg.slots(); ++slot) {
        std::optional<ckpt::SnapshotSegment::View> v;
        try {
          v = seg.slot(slot);
        } catch (const std::exception&) {
          continue;
        }
        if (!v) continue;
        const std::vector<int64_t> bad = seg.corrupt_blocks(*v);
        if (bad.empty()) continue;
        const std::string what = str(own[size_t(local)], " slot ", slot, " (step ", v->meta.step,
                                     "): ", bad.size(), " corrupt block(s)");
        if (int(ring.nodes.size()) < o_.k + o_.m) {
          log_(what + "; epoch " + std::to_string(epoch) + " had no parity: not repaired");
          continue;
        }
        try {
          const ckpt::StripeLayout l(int(ring.nodes.size()), o_.k, o_.m);
          const int K = l.data_fragments(l.group_of(ring.node));
          const int64_t c = ckpt::chunk_bytes(v->meta.payload_bytes, K);
          std::set<int64_t> chunks;
          for (int64_t b : bad) chunks.insert(b * ckpt::kSnapshotBlockBytes / c);
          // The slot is this node's own and committed; no worker writes it during a recovery.
          auto* payload = static_cast<uint8_t*>(const_cast<void*>(v->payload));
          for (int64_t t : chunks) {
            const ckpt::StripeId s = l.stripe_of_chunk(ring.node, local, int(t));
            std::vector<StripeSlot> at;
            for (StripeSlot& x : stripe_slots(ring, l, s, {}))
              if (x.step == v->meta.step) at.push_back(std::move(x));
            if (at.empty()) throw IoError(str("no parity of step ", v->meta.step, " for chunk ", t));
            const int64_t n = std::clamp<int64_t>(v->meta.payload_bytes - t * c, 0, c);
            if (n > 0) decode_fragment(ring, l, s, int(t), at, {}, payload + t * c, n);
          }
          const std::vector<int64_t> still = seg.corrupt_blocks(*v);
          log_(what + (still.empty() ? str("; repaired from parity (", chunks.size(), " chunk(s))")
                                     : str("; ", still.size(), " still corrupt after decoding")));
        } catch (const std::exception& e) {
          log_(what + "; not repaired: " + e.what());
        }
      }
    }
  }
}

// ---- bookkeeping ----------------------------------------------------------------------------

std::vector<ckpt::SegmentInfo> SnapshotParity::list() const {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<ckpt::SegmentInfo> out;
  for (const auto& [name, seg] : rebuilt_) {
    const std::optional<ckpt::SegmentName> p = ckpt::parse_segment_name(name);
    ckpt::SegmentInfo s{name, p ? p->epoch : 0, p ? p->rank : -1, seg->capacity(), seg->owner_pid(),
                        std::nullopt};
    try {
      if (std::optional<ckpt::SnapshotSegment::View> v = seg->latest()) s.committed = v->meta;
    } catch (const std::exception&) {
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<std::string> SnapshotParity::retire_older_than(int64_t epoch) {
  std::lock_guard<std::mutex> l(mu_);
  retired_below_ = std::max(retired_below_, epoch);
  std::vector<std::string> out;
  for (auto* held : {&parity_, &rebuilt_})
    for (auto it = held->begin(); it != held->end();) {
      const std::optional<ckpt::SegmentName> p = ckpt::parse_segment_name(it->first);
      if (!p || p->epoch >= epoch) {
        ++it;
        continue;
      }
      ckpt::SnapshotSegment::unlink(it->first);
      out.push_back(it->first);
      it = held->erase(it);
    }
  for (auto it = accumulating_.begin(); it != accumulating_.end();)
    it = it->second->epoch < epoch ? accumulating_.erase(it) : std::next(it);
  return out;
}

void SnapshotParity::stop() {
  std::vector<std::shared_ptr<ckpt::PeerChannel>> links;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopped_) return;
    stopped_ = true;
    for (const Links* cache : {&push_links_, &fetch_links_})
      for (const auto& [peer, ch] : *cache) links.push_back(ch);
  }
  cv_.notify_all();
  for (auto& ch : links) ch->abort();
  if (worker_.joinable()) worker_.join();
}

void SnapshotParity::clear() {
  std::lock_guard<std::mutex> l(mu_);
  parity_.clear();
  rebuilt_.clear();
  accumulating_.clear();
}

}  // namespace weft::launch
