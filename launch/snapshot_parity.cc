// Erasure-coded snapshots between snapshot agents (snapshot_parity.h).
#include "launch/snapshot_parity.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <future>
#include <set>
#include <thread>

#include "base/check.h"
#include "base/env.h"
#include "base/error.h"
#include "checkpoint/crc32c.h"
#include "launch/snapshot_parity_bytes.h"

namespace weft::launch {

namespace ckpt = checkpoint;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kMaxFetchBytes = int64_t(1) << 40;
constexpr size_t kStepsKeptAccumulating = 4;  // per stripe: older unfinished steps are dropped
constexpr int kParitySlots = 3;  // as many steps as the data segments keep (docs: "Why the steps meet")

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

int64_t blocks_of(int64_t bytes) {
  return (bytes + ckpt::kSnapshotBlockBytes - 1) / ckpt::kSnapshotBlockBytes;
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

}  // namespace

namespace parity_bytes {  // snapshot_parity_bytes.h

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string mib(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f MiB", bytes / (1 << 20));
  return b;
}

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

std::optional<ckpt::SnapshotSegment::View> newest_of_step(const ckpt::SnapshotSegment& seg,
                                                          int64_t step) {
  std::optional<ckpt::SnapshotSegment::View> best;
  for (int s = 0; s < seg.slots(); ++s) {
    std::optional<ckpt::SnapshotSegment::View> v = seg.slot(s);
    if (v && v->meta.step == step && (!best || v->meta.sequence > best->meta.sequence)) best = v;
  }
  return best;
}

bool read_range(const std::string& segment, int64_t step, int64_t offset, int64_t length,
                uint8_t* out) {
  return read_range(ckpt::SnapshotSegment::open(segment, false), step, offset, length, out);
}

bool read_range(const ckpt::SnapshotSegment& seg, int64_t step, int64_t offset, int64_t length,
                uint8_t* out) {
  const std::optional<ckpt::SnapshotSegment::View> best = newest_of_step(seg, step);
  if (!best) throw IoError(str(seg.name(), " holds no committed snapshot of step ", step));
  const int64_t have = std::clamp<int64_t>(best->meta.payload_bytes - offset, 0, length);
  if (have > 0) std::memcpy(out, static_cast<const uint8_t*>(best->payload) + offset, size_t(have));
  std::memset(out + have, 0, size_t(length - have));
  return seg.sequence(best->slot) == best->meta.sequence;
}

}  // namespace parity_bytes

using namespace parity_bytes;

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

double SnapshotParity::ahead_bytes_of(int64_t epoch, int locals, int64_t capacity) const {
  const std::optional<ReplicaRing> ring = ring_of(epoch);
  const int n = ring ? int(ring->nodes.size()) : 0;
  if (ring && !layout_of(*ring)) return 0;
  const ckpt::GroupBound g = ckpt::group_bound(n, ring ? ring->node : 0, o_.k, o_.m);
  return ahead_bytes(locals, capacity, g.size, g.data_fragments);
}

std::optional<ckpt::StripeLayout> SnapshotParity::layout_of(const ReplicaRing& ring) const {
  const int n = int(ring.nodes.size());
  if (!ckpt::StripeLayout::codes(n, o_.m)) return std::nullopt;
  return ckpt::StripeLayout(n, o_.k, o_.m);
}

int SnapshotParity::data_fragments_of(int64_t epoch) const {
  const std::optional<ReplicaRing> ring = ring_of(epoch);
  if (!ring) return o_.k;
  const std::optional<ckpt::StripeLayout> l = layout_of(*ring);
  return l ? l->data_fragments(l->group_of(ring->node)) : 0;
}

bool SnapshotParity::reduced(int64_t epoch) const {
  const std::optional<ReplicaRing> ring = ring_of(epoch);
  const std::optional<ckpt::StripeLayout> l = ring ? layout_of(*ring) : std::nullopt;
  return l && l->reduced();
}

void SnapshotParity::decline(int64_t epoch, const std::string& why) {
  int dropped = 0;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!declined_.emplace(epoch, why).second) return;
    prepared_.insert(epoch);  // nothing made ahead: a rebuild here would lack this parity
    to_prepare_.erase(epoch);
    // Parity of the epoch kept before the reserve came (a peer committed first): its memory
    // back, not a stripe left half protected.
    for (auto it = parity_.begin(); it != parity_.end();) {
      const std::optional<ckpt::SegmentName> p = ckpt::parse_segment_name(it->first);
      if (!p || p->epoch != epoch) {
        ++it;
        continue;
      }
      ckpt::SnapshotSegment::unlink(it->first);
      it = parity_.erase(it);
      ++dropped;
    }
  }
  log_(str("epoch ", epoch, ": this node holds no parity in this epoch: ", why,
           dropped > 0 ? str(" (", dropped, " parity segment(s) of it already made removed)")
                       : std::string()));
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
        bool empty = false;  // a rebuild target made ahead (or a rebuild cut short)
        try {
          empty = p.kind == ckpt::SegmentKind::kRebuilt && !seg->latest();
        } catch (const std::exception&) {
        }
        std::lock_guard<std::mutex> l(mu_);
        if (empty) ahead_.insert(name);  // not listed; a rebuild of its node may write it
        (p.kind == ckpt::SegmentKind::kParity ? parity_ : rebuilt_)[name] = std::move(seg);
        log_(str("adopted ", name, " (left by pid ", was, ")"));
      },
      log_);
}

// ---- pushing: the data side -------------------------------------------------------------

std::string SnapshotParity::link_key(const std::string& endpoint, int lane) {
  return lane == 0 ? endpoint : str(endpoint, "#", lane);
}

std::shared_ptr<ckpt::PeerChannel> SnapshotParity::channel(const ReplicaRing& ring, int node,
                                                           Links& cache, bool* reused, int lane) {
  const std::string& peer = ring.nodes.at(size_t(node));
  const std::string key = link_key(peer, lane);
  if (reused) *reused = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopped_) throw IoError("the agent is stopping");
    auto it = cache.find(key);
    if (it != cache.end() && it->second->open()) {
      if (reused) *reused = true;
      return it->second;
    }
  }
  std::shared_ptr<ckpt::PeerChannel> ch =
      ckpt::PeerChannel::connect(peer, o_.auth, ring.node, o_.timeout);
  std::lock_guard<std::mutex> l(mu_);
  cache[key] = ch;
  return ch;
}

void SnapshotParity::drop(Links& cache, const std::string& key) {
  std::lock_guard<std::mutex> l(mu_);
  cache.erase(key);
}

json SnapshotParity::call(const ReplicaRing& ring, int node, Links& cache, const json& request,
                          std::shared_ptr<ckpt::PeerChannel>* used, int lane) {
  const std::string peer = link_key(ring.nodes.at(size_t(node)), lane);
  for (int attempt = 0;; ++attempt) {
    bool reused = false;
    std::shared_ptr<ckpt::PeerChannel> ch = channel(ring, node, cache, &reused, lane);
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
  const std::optional<ckpt::StripeLayout> coded = layout_of(*ring);
  if (!coded) return;  // said by set_ring
  const std::optional<ckpt::SnapshotSegment::View> v = newest_unsent(e, ring->epoch, pushed_);
  if (!v) return;
  const ckpt::StripeLayout& layout = *coded;
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
  {
    std::lock_guard<std::mutex> l(mu_);
    data_[e.name] = e.segment;  // mapped in by the push: fetches of it read it here (mapped)
  }
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
    std::lock_guard<std::mutex> l(mu_);
    if (auto d = declined_.find(meta.epoch); d != declined_.end()) bad = d->second;
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
    // Declined while this stripe's chunks arrived (decline): not made again.
    if (auto d = declined_.find(epoch); d != declined_.end()) return d->second;
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
  // Sent straight from the slot's mapping, then checked for a rewrite under it ("intact"):
  // a copy into a fresh buffer first cost its page faults and a pass over the bytes, about
  // as much as the send itself on loopback.
  // Through this agent's own mapping when it has one (its parity, the data it pushed): those
  // pages are mapped in already; a fresh mapping took a page fault per 4 KiB sent.
  std::shared_ptr<const ckpt::SnapshotSegment> seg = mapped(name);
  // Tests only (WEFT_TEST_HOLD_FETCHES_AFTER=N): the fetches of every segment but the first N
  // this agent served are held until it is killed, so that a test cuts a rebuild between its
  // fragments without racing the transfer.
  static const size_t hold_after =
      size_t(std::max<int64_t>(0, env_int("WEFT_TEST_HOLD_FETCHES_AFTER", 0)));
  static std::set<std::string> served_first;  // the first hold_after segments (under mu_)
  bool hold = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (served_.insert(name).second)
      log_(str("serving fetches of ", name, seg ? " through this agent's own mapping of it"
                                               : " through a mapping made for each fetch"));
    if (hold_after > 0) {
      if (served_first.size() < hold_after) served_first.insert(name);
      hold = served_first.count(name) == 0;
    }
  }
  while (hold) std::this_thread::sleep_for(std::chrono::seconds(1));
  std::optional<ckpt::SnapshotSegment::View> v;
  try {
    if (!seg) seg = std::make_shared<const ckpt::SnapshotSegment>(ckpt::SnapshotSegment::open(name, false));
    v = newest_of_step(*seg, step);
    if (!v) throw IoError(str(name, " holds no committed snapshot of step ", step));
  } catch (const std::exception& e) {
    ch.send({{"ok", false}, {"error", e.what()}});
    return;
  }
  ch.send({{"ok", true}});
  const int64_t have = std::clamp<int64_t>(v->meta.payload_bytes - offset, 0, length);
  if (have > 0) ch.send_bytes(static_cast<const uint8_t*>(v->payload) + offset, size_t(have));
  static const std::vector<uint8_t> zeros(size_t(1) << 20);
  for (int64_t left = length - have; left > 0; left -= int64_t(zeros.size()))
    ch.send_bytes(zeros.data(), size_t(std::min<int64_t>(left, int64_t(zeros.size()))));
  ch.send({{"intact", seg->sequence(v->slot) == v->meta.sequence}});
}

// ---- bookkeeping ----------------------------------------------------------------------------

std::shared_ptr<const ckpt::SnapshotSegment> SnapshotParity::mapped(const std::string& name) const {
  std::lock_guard<std::mutex> l(mu_);
  for (const auto* held : {&parity_, &rebuilt_})
    if (auto it = held->find(name); it != held->end()) return it->second;
  if (auto it = data_.find(name); it != data_.end()) return it->second;
  return nullptr;
}

std::vector<ckpt::SegmentInfo> SnapshotParity::list() const {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<ckpt::SegmentInfo> out;
  for (const auto& [name, seg] : rebuilt_) {
    if (ahead_.count(name)) continue;  // made ahead (prepare): no snapshot, nothing to offer
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
      ahead_.erase(it->first);
      it = held->erase(it);
    }
  for (auto it = accumulating_.begin(); it != accumulating_.end();)
    it = it->second->epoch < epoch ? accumulating_.erase(it) : std::next(it);
  for (auto it = data_.begin(); it != data_.end();) {  // the agent unlinks those itself
    const std::optional<ckpt::SegmentName> p = ckpt::parse_segment_name(it->first);
    it = !p || p->epoch < epoch ? data_.erase(it) : std::next(it);
  }
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
  ahead_.clear();
  data_.clear();
  accumulating_.clear();
}

}  // namespace weft::launch
