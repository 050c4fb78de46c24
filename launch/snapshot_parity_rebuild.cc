// Erasure-coded snapshots (snapshot_parity.h): rebuilding a lost node's ranks from the
// survivors' data and parity, and repairing a corrupt block in place.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "base/check.h"
#include "base/error.h"
#include "checkpoint/snapshot_fetch_window.h"
#include "launch/snapshot_parity.h"
#include "launch/snapshot_parity_bytes.h"

namespace weft::launch {

namespace ckpt = checkpoint;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace parity_bytes;

// ---- rebuilding and repairing ---------------------------------------------------------------

void SnapshotParity::repair(const std::string& segment, int64_t step, Done done) {
  std::lock_guard<std::mutex> l(mu_);
  tasks_.push_back({Task::kRepair, 0, -1, {}, segment, step, std::move(done)});
  cv_.notify_all();
}

void SnapshotParity::prepare(int64_t epoch, int locals, int64_t capacity) {
  std::lock_guard<std::mutex> l(mu_);
  if (prepared_.count(epoch) || to_prepare_.count(epoch)) return;  // each worker reserves
  to_prepare_[epoch] = {locals, capacity};
  tasks_.push_back({Task::kPrepare, epoch, -1, {}});
  cv_.notify_all();
}

double SnapshotParity::ahead_bytes(int locals, int64_t capacity, int group_size,
                                   int data_fragments) {
  const int64_t piece =
      std::min<int64_t>(kDecodePieceBytes, ckpt::chunk_bytes(capacity, data_fragments));
  return locals * snapshot_segment_bytes(capacity, 1) +
         double(kDecodeSets) * group_size * double(piece);
}

bool SnapshotParity::prepare_asked(int64_t epoch) const {
  std::lock_guard<std::mutex> l(mu_);
  return prepared_.count(epoch) > 0 || to_prepare_.count(epoch) > 0;
}

bool SnapshotParity::settled(int64_t epoch) const {
  std::lock_guard<std::mutex> l(mu_);
  // Rebuild targets being made ahead hold no list: nothing listed comes from them.
  return !rings_.empty() && rings_.rbegin()->first >= epoch && (!working_ || preparing_) &&
         std::all_of(tasks_.begin(), tasks_.end(),
                     [](const Task& t) { return t.kind == Task::kPrepare; });
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
      preparing_ = t.kind == Task::kPrepare;
    }
    try {
      if (t.kind == Task::kRebuild)
        rebuild(t);
      else if (t.kind == Task::kNewRing)
        new_ring(t.epoch);
      else if (t.kind == Task::kPrepare)
        prepare_ahead(t.epoch);
      else
        t.done(repair_slot(t));
    } catch (const std::exception& e) {
      log_(str(t.kind == Task::kRepair    ? "repair"
               : t.kind == Task::kPrepare ? "making the rebuild targets ahead"
                                          : "rebuild",
               " failed: ", e.what()));
      if (t.kind == Task::kRepair) t.done({{"ok", false}, {"error", e.what()}});
    }
    std::lock_guard<std::mutex> l(mu_);
    // Its memory back between tasks, unless made ahead with the rebuild targets (prepare).
    if (ahead_.empty()) std::vector<std::vector<uint8_t>>().swap(scratch_);
    working_ = false;
  }
}

json SnapshotParity::ask(const ReplicaRing& ring, int node, const json& request) {
  std::shared_ptr<ckpt::PeerChannel> ch;
  return call(ring, node, fetch_links_, request, &ch);
}

void SnapshotParity::fetch(const ReplicaRing& ring, int node, const std::string& segment,
                           int64_t step, int64_t offset, int64_t length, uint8_t* out, int lane) {
  if (node == ring.node) {
    const std::shared_ptr<const ckpt::SnapshotSegment> seg = mapped(segment);
    {
      std::lock_guard<std::mutex> l(mu_);  // (the pieces' threads)
      spent_.local_reads++;
      spent_.local_mapped += seg != nullptr;
    }
    if (!(seg ? read_range(*seg, step, offset, length, out)
              : read_range(segment, step, offset, length, out)))
      throw IoError(str(segment, " step ", step, " was rewritten while read"));
    return;
  }
  const std::string& peer = ring.nodes.at(size_t(node));
  std::shared_ptr<ckpt::PeerChannel> ch;
  const json r = call(ring, node, fetch_links_,
                      {{"op", "fetch"},
                       {"segment", segment},
                       {"step", step},
                       {"offset", offset},
                       {"length", length}},
                      &ch, lane);
  try {
    if (!r.value("ok", false))
      throw IoError(str("node ", node, " at ", peer, ": ", r.value("error", std::string("refused"))));
    ch->receive_bytes(out, size_t(length));
    if (!ch->receive().value("intact", false))
      throw IoError(str(segment, " step ", step, " was rewritten at node ", node, " while fetched"));
  } catch (const IoError&) {
    throw;
  } catch (...) {
    drop(fetch_links_, link_key(peer, lane));
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
                                     const std::set<int>& gone, uint8_t* out, int64_t out_len,
                                     const std::function<void(int64_t, int64_t)>& before_write,
                                     const std::function<void(int64_t, int64_t)>& after_write) {
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
    // A fragment of this node held through this agent's own mapping (its data as pushed, its
    // parity): decoded from in place, not copied into a piece first. `in_place` points at its
    // first byte and `in_place_bytes` is how many of them the payload holds; the slot's
    // sequence is checked once the fragment is decoded (a rewrite meanwhile throws, as a
    // copy's would).
    std::shared_ptr<const ckpt::SnapshotSegment> held;
    std::optional<ckpt::SnapshotSegment::View> view;
    const uint8_t* in_place = nullptr;
    int64_t in_place_bytes = 0;
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
    if (x.node == ring.node && (x.held = mapped(x.segment)) &&
        (x.view = newest_of_step(*x.held, step))) {
      x.in_place = static_cast<const uint8_t*>(x.view->payload) + x.offset;
      x.in_place_bytes = std::clamp<int64_t>(x.view->meta.payload_bytes - x.offset, 0, x.length);
    }
    sources.push_back(std::move(x));
  }
  // Piece by piece, in kDecodeSets sets of small buffers reused throughout, each piece
  // fetched over kFetchLanes connections per source at once and decoded as soon as all of
  // its sources arrived, in whatever order they do (checkpoint/snapshot_fetch_window.h): one
  // request at a time on one connection left the serving agent's CPU share, on a node whose
  // workers fault in their next layout meanwhile, as the only pace (waiting for fetches was
  // 557 of a 762 ms rebuild of 403 MiB in the node-loss bench). The lost fragment decodes
  // straight into `out`.
  const int64_t P = std::min<int64_t>(kDecodePieceBytes, std::max<int64_t>(L, 1));
  const int64_t pieces = (out_len + P - 1) / P;
  const auto t_scratch = Clock::now();
  std::vector<std::vector<uint8_t>>& bufs = scratch_;
  bufs.resize(size_t(kDecodeSets) * size_t(n));
  for (auto& b : bufs)
    if (int64_t(b.size()) < P) b.resize(size_t(P));
  spent_.scratch += since(t_scratch);
  // Whether piece [o, o + piece) of source x is read in place: all of it in the payload (a
  // piece past the payload's end is copied, for its zero padding).
  auto in_place = [&](const Source& x, int64_t o, int64_t piece) {
    return x.in_place != nullptr && o + piece <= x.in_place_bytes;
  };
  std::vector<std::vector<int>> needs(static_cast<size_t>(pieces));
  for (int64_t i = 0; i < pieces; ++i) {
    const int64_t o = i * P, piece = std::min(P, L - o);
    for (size_t j = 0; j < sources.size(); ++j) {
      if (!in_place(sources[j], o, piece)) {
        needs[size_t(i)].push_back(int(j));
        continue;
      }
      std::lock_guard<std::mutex> l(mu_);
      spent_.local_reads++;
      spent_.local_mapped++;
      spent_.local_in_place++;
    }
  }
  ckpt::FetchWindow window(needs, int(sources.size()), kDecodeSets);
  std::vector<std::thread> lanes;
  auto lane = [&, step](size_t j, int number) {
    const Source& x = sources[j];
    try {
      for (int64_t i; (i = window.next_fetch(int(j))) >= 0;) {
        const int64_t o = i * P, piece = std::min(P, L - o);
        uint8_t* buf = bufs[size_t((i % kDecodeSets) * n + x.f)].data();
        const int64_t have = std::clamp<int64_t>(x.length - o, 0, piece);
        if (have > 0) fetch(ring, x.node, x.segment, step, x.offset + o, have, buf, number);
        std::memset(buf + have, 0, size_t(piece - have));  // a short fragment's zero padding
        window.arrived(i, int(j));
      }
    } catch (...) {
      window.fail(std::current_exception());
    }
  };
  // Every lane is joined before this returns or throws: they write into `bufs`.
  struct Join {
    ckpt::FetchWindow& w;
    std::vector<std::thread>& t;
    ~Join() {
      w.stop();
      for (auto& x : t) x.join();
    }
  } join{window, lanes};
  for (size_t j = 0; j < sources.size(); ++j) {
    const bool any = std::any_of(needs.begin(), needs.end(), [&](const std::vector<int>& v) {
      return std::find(v.begin(), v.end(), int(j)) != v.end();
    });
    // This node's own bytes not held in place are a local read: one lane is enough.
    const int count = !any ? 0 : sources[j].node == ring.node ? 1 : kFetchLanes;
    for (int k = 0; k < count; ++k) lanes.emplace_back(lane, j, k);
  }
  for (;;) {
    auto t = Clock::now();
    const int64_t i = window.next_decode();
    spent_.fetch_wait += since(t);
    if (i < 0) break;
    t = Clock::now();
    const int64_t o = i * P, set = i % kDecodeSets;
    const int64_t piece = std::min(P, L - o), direct = std::min(piece, out_len - o);
    if (before_write) {
      const auto tp = Clock::now();
      before_write(o, direct);
      spent_.populate += since(tp);
      t = Clock::now();
    }
    std::vector<uint8_t*> ptrs;
    for (int f = 0; f < n; ++f) ptrs.push_back(bufs[size_t(set * n + f)].data());
    for (const Source& x : sources)  // read, never written (ErasureCode::reconstruct)
      if (in_place(x, o, piece)) ptrs[size_t(x.f)] = const_cast<uint8_t*>(x.in_place + o);
    if (direct == piece) ptrs[size_t(lost)] = out + o;
    code(K).reconstruct(ptrs, erased, size_t(piece));
    if (direct < piece) std::memcpy(out + o, ptrs[size_t(lost)], size_t(direct));
    spent_.decode += since(t);
    if (after_write) {
      // While the other pieces are fetched (a rebuild checks the piece's block checksums).
      t = Clock::now();
      after_write(o, direct);
      spent_.check += since(t);
    }
    window.decoded(i);
  }
  for (const Source& x : sources)
    if (x.in_place && x.held->sequence(x.view->slot) != x.view->meta.sequence)
      throw IoError(str(x.segment, " step ", step, " was rewritten while decoded from"));
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

void SnapshotParity::prepare_ahead(int64_t epoch) {
  std::pair<int, int64_t> own;  // the node's ranks of the epoch and the largest one's bytes
  {
    std::lock_guard<std::mutex> l(mu_);
    // Done already, not reserved yet (its reserve queues it again), or an older epoch's (a
    // newer ring came: a loss now is of that one).
    auto it = to_prepare_.find(epoch);
    if (prepared_.count(epoch) || it == to_prepare_.end() || rings_.empty() ||
        rings_.rbegin()->first != epoch)
      return;
    own = it->second;
  }
  const std::optional<ReplicaRing> ring = ring_of(epoch);
  const std::optional<ckpt::StripeLayout> coded = ring ? layout_of(*ring) : std::nullopt;
  if (!coded) return;
  const ckpt::StripeLayout& l = *coded;
  const int g = l.group_of(ring->node), G = l.group_size(g), K = l.data_fragments(g);
  // The node this one rebuilds when it is lost alone: the first survivor after it (rebuild).
  const int lost = l.node_at(g, l.position(ring->node) - 1);
  const auto [locals, capacity] = own;
  const int64_t piece = std::min<int64_t>(kDecodePieceBytes, ckpt::chunk_bytes(capacity, K));
  const double need = ahead_bytes(locals, capacity, G, K);
  const NodeMemory m = read_node_memory();
  const double room = snapshot_room(m);
  {
    std::lock_guard<std::mutex> lk(mu_);
    prepared_.insert(epoch);
    to_prepare_.erase(epoch);
  }
  if (need > room) {
    log_(str("epoch ", epoch, ": no rebuild target made ahead for node ", lost, ": ",
             mib(need), " do not fit the node's memory (", mib(std::max(0.0, room)),
             " free less the margin); a rebuild of it allocates its pages as it writes"));
    return;
  }
  const auto t0 = Clock::now();
  std::vector<std::string> made;
  try {
    for (int local = 0; local < locals; ++local) {
      // Named for the rank that node most likely has (every node runs as many workers); a
      // rebuild of another rank renames it (take_ahead).
      const int rank = lost * locals + local;
      const std::string name =
          ckpt::segment_name(o_.auth.job, ckpt::SegmentKind::kRebuilt, lost, epoch, rank);
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (rebuilt_.count(name)) continue;  // adopted, or rebuilt already
      }
      ckpt::SnapshotSegment::unlink(name);  // a stale one nobody holds
      auto seg = std::make_shared<ckpt::SnapshotSegment>(ckpt::SnapshotSegment::create(
          name, std::max<int64_t>(capacity, 1), int(::getpid()), ckpt::kMinSnapshotSlots,
          o_.guardian_pid, false));
      // The slot a rebuild's begin() takes (the first: none is committed), begun with a
      // placeholder and left uncommitted (never listed as a snapshot), its pages allocated
      // and mapped in through this mapping, which the rebuild writes through.
      ckpt::SnapshotMeta placeholder;
      placeholder.job_id = o_.auth.job;
      placeholder.kind = ckpt::SegmentKind::kRebuilt;
      placeholder.owner_node = lost;
      placeholder.epoch = epoch;
      placeholder.rank = rank;
      placeholder.payload_bytes = capacity;
      seg->begin(placeholder);
      // In pieces, each after a look for a newer ring: a loss in this epoch's first moments
      // queues its rebuild behind this task, which must not hold it for the rest of the
      // allocation (seconds while the workers start). A target cut short is dropped whole:
      // a rebuild skips populate_writing only for one allocated throughout.
      for (int64_t at = 0; at < capacity; at += kPreparePieceBytes) {
        {
          std::lock_guard<std::mutex> lk(mu_);
          if (rings_.rbegin()->first != epoch || stopped_) {
            ckpt::SnapshotSegment::unlink(name);
            log_(str("epoch ", epoch, ": making the rebuild targets for node ", lost,
                     " ahead stopped: epoch ", rings_.rbegin()->first,
                     "'s ring came (a rebuild of it allocates its pages as it writes)"));
            return;
          }
        }
        seg->populate_writing(at, std::min(kPreparePieceBytes, capacity - at));
      }
      std::lock_guard<std::mutex> lk(mu_);
      rebuilt_[name] = seg;
      ahead_.insert(name);
      made.push_back(name);
    }
    // The decode's pieces too (kDecodeSets sets of one per fragment), touched now.
    scratch_.resize(size_t(kDecodeSets) * static_cast<size_t>(G));
    for (auto& b : scratch_)
      if (int64_t(b.size()) < piece) b.resize(size_t(piece));
  } catch (const std::exception& e) {
    log_(str("epoch ", epoch, ": the rebuild targets made ahead for node ", lost,
             " stopped: ", e.what(), "; a rebuild allocates its pages as it writes"));
    return;
  }
  if (!made.empty())
    log_(str("epoch ", epoch, ": made ahead the segment(s) a rebuild of node ", lost,
             " would write if it were lost: ", made.size(), " of ", mib(double(capacity)),
             ", their pages allocated in ", since(t0) * 1e3, " ms"));
}

std::shared_ptr<ckpt::SnapshotSegment> SnapshotParity::take_ahead(int64_t epoch, int lost,
                                                                  int64_t payload,
                                                                  const std::string& name) {
  std::lock_guard<std::mutex> l(mu_);
  // A segment of that name that is not one made ahead: an earlier try's (rebuild's own path).
  if (rebuilt_.count(name) && !ahead_.count(name)) return nullptr;
  std::string pick;
  for (const std::string& a : ahead_) {
    const std::optional<ckpt::SegmentName> p = ckpt::parse_segment_name(a);
    auto it = rebuilt_.find(a);
    if (!p || p->epoch != epoch || p->owner_node != lost || it == rebuilt_.end() ||
        it->second->capacity() < payload)
      continue;
    if (pick.empty() || a == name) pick = a;
  }
  if (pick.empty()) return nullptr;
  std::shared_ptr<ckpt::SnapshotSegment> seg = rebuilt_.at(pick);
  if (pick != name) {
    ckpt::SnapshotSegment::unlink(name);  // a stale one nobody holds
    seg->rename(name);
    rebuilt_.erase(pick);
    rebuilt_[name] = seg;
  }
  ahead_.erase(pick);
  return seg;
}

bool SnapshotParity::rebuild(const Task& task) {
  const std::optional<ReplicaRing> ring = ring_of(task.epoch);
  const std::optional<ckpt::StripeLayout> coded = ring ? layout_of(*ring) : std::nullopt;
  if (!coded) return true;
  const ckpt::StripeLayout& l = *coded;
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
        spent_ = {};
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
        std::shared_ptr<ckpt::SnapshotSegment> seg = take_ahead(task.epoch, task.lost, payload, name);
        spent_.ahead = seg != nullptr;
        if (!seg) {
          std::lock_guard<std::mutex> lk(mu_);
          if (auto f = rebuilt_.find(name); f != rebuilt_.end()) seg = f->second;
        }
        if (seg && seg->capacity() < payload) {
          ckpt::SnapshotSegment::unlink(name);
          std::lock_guard<std::mutex> lk(mu_);
          rebuilt_.erase(name);
          ahead_.erase(name);
          seg.reset();
        }
        if (!seg) {
          ckpt::SnapshotSegment::unlink(name);  // a half-made one of an earlier try
          // Its slots' pages are allocated as each is written (populate_writing below): a
          // rebuild writes one, and allocating both at create cost twice the memory's
          // zeroing, then a page fault per page as the decode wrote.
          seg = std::make_shared<ckpt::SnapshotSegment>(
              ckpt::SnapshotSegment::create(name, std::max<int64_t>(payload, 1), int(::getpid()),
                                            ckpt::kMinSnapshotSlots, o_.guardian_pid, false));
          std::lock_guard<std::mutex> lk(mu_);
          rebuilt_[name] = seg;
        }
        meta.kind = ckpt::SegmentKind::kRebuilt;
        auto* out = static_cast<uint8_t*>(seg->begin(meta));
        spent_.segment = since(t1);
        int64_t checked = 0;
        for (int t = 0; t < K; ++t) {
          // Chunk t of the lost rank is data fragment t of its t-th stripe. Its pages are
          // allocated piece by piece while the next piece is fetched, and each piece decoded
          // is checked against the rank's block checksums then too, not in a pass after the
          // last (pieces start at multiples of a block: chunks and pieces are whole blocks).
          const int64_t n = std::clamp<int64_t>(payload - t * c, 0, c);
          if (n > 0)
            decode_fragment(
                *ring, l, stripes[size_t(t)], t, at[size_t(t)], task.gone, out + t * c, n,
                spent_.ahead
                    ? std::function<void(int64_t, int64_t)>()
                    : [&](int64_t o, int64_t len) { seg->populate_writing(t * c + o, len); },
                [&](int64_t o, int64_t len) {
                  if (!blocks_match(out + t * c + o, t * c + o, len, payload, crcs))
                    throw IoError(str("the decoded bytes at ", t * c + o,
                                      " do not match the rank's checksums"));
                  checked += len;
                });
        }
        const auto t2 = Clock::now();
        WEFT_CHECK(checked == payload, "rebuild checked ", checked, " of ", payload, " bytes");
        seg->commit(crcs);
        const double check_s = spent_.check + since(t2);
        // The parts of "fetch and decode": the segment made, its slot's pages allocated, the
        // waits for fetches not yet arrived, the decode into the segment, the check of its
        // checksums.
        log_(str("rebuilt node ", task.lost, "'s rank ", meta.rank, " (epoch ", task.epoch,
                 ", step ", step, ") from parity into ", name, ": ", mib(double(payload)), " in ",
                 since(t0) * 1e3, " ms (asking the holders ", ask_s * 1e3, " ms, fetch and decode ",
                 since(t1) * 1e3, " ms: segment ", spent_.segment * 1e3,
                 spent_.ahead ? " made ahead" : "", ", allocating its pages ",
                 spent_.populate * 1e3, ", scratch buffers ", spent_.scratch * 1e3,
                 ", waiting for fetches ", spent_.fetch_wait * 1e3, ", decoding ",
                 spent_.decode * 1e3, ", checking ", check_s * 1e3, "; pieces read here ",
                 spent_.local_reads, ", ", spent_.local_mapped,
                 " of them through this agent's own mapping, ", spent_.local_in_place,
                 " decoded from in place)"));
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

json SnapshotParity::repair_slot(const Task& task) {
  const std::optional<ckpt::SegmentName> name = ckpt::parse_segment_name(task.segment);
  if (!name || name->kind != ckpt::SegmentKind::kData || name->job_id != o_.auth.job)
    throw IoError(str(task.segment, " is not a data segment of job ", o_.auth.job));
  const std::optional<ReplicaRing> ring = ring_of(name->epoch);
  if (!ring || ring->node != name->owner_node)
    throw IoError(str(task.segment, " is not this node's: it is node ", name->owner_node,
                      "'s of epoch ", name->epoch, ", and this agent ",
                      ring ? str("was node ", ring->node) : std::string("knows no ring of it")));
  const std::optional<ckpt::StripeLayout> coded = layout_of(*ring);
  if (!coded)
    throw IoError(str("epoch ", name->epoch, " had ", ring->nodes.size(),
                      " node(s), fewer than m + 1: its snapshots have no parity to repair from"));
  const std::vector<std::string> own = own_data(o_.auth.job, ring->node, name->epoch);
  const auto at = std::find(own.begin(), own.end(), task.segment);
  if (at == own.end()) throw IoError(str(task.segment, " is not among this node's segments"));
  const int local = int(at - own.begin());
  ckpt::SnapshotSegment seg = ckpt::SnapshotSegment::open(task.segment, true);
  std::optional<ckpt::SnapshotSegment::View> v;
  for (int slot = 0; slot < seg.slots() && !v; ++slot)
    if (std::optional<ckpt::SnapshotSegment::View> x = seg.slot(slot);
        x && x->meta.step == task.step)
      v = x;
  if (!v) throw IoError(str(task.segment, " holds no committed snapshot of step ", task.step));
  const auto t0 = Clock::now();
  const std::vector<int64_t> bad = seg.corrupt_blocks(*v);
  if (bad.empty()) return {{"ok", true}, {"repaired", 0}};
  const std::string what = str(task.segment, " slot ", v->slot, " (step ", task.step,
                               "): ", bad.size(), " corrupt block(s)");
  const auto g = gone_.find(name->epoch);
  const std::set<int> gone = g == gone_.end() ? std::set<int>{} : g->second;
  const ckpt::StripeLayout& l = *coded;
  const int K = l.data_fragments(l.group_of(ring->node));
  const int64_t c = ckpt::chunk_bytes(v->meta.payload_bytes, K);
  std::set<int64_t> chunks;
  for (int64_t b : bad) chunks.insert(b * ckpt::kSnapshotBlockBytes / c);
  // The slot is this node's own and committed: its worker writes the other slot while it
  // trains, and a worker reading it waits for this reply.
  auto* payload = static_cast<uint8_t*>(const_cast<void*>(v->payload));
  try {
    for (int64_t t : chunks) {
      const ckpt::StripeId s = l.stripe_of_chunk(ring->node, local, int(t));
      std::vector<StripeSlot> at_step;
      for (StripeSlot& x : stripe_slots(*ring, l, s, gone))
        if (x.step == task.step) at_step.push_back(std::move(x));
      if (at_step.empty()) throw IoError(str("no parity of step ", task.step, " for chunk ", t));
      const int64_t n = std::clamp<int64_t>(v->meta.payload_bytes - t * c, 0, c);
      if (n > 0) decode_fragment(*ring, l, s, int(t), at_step, gone, payload + t * c, n);
    }
  } catch (const std::exception& e) {
    log_(what + "; not repaired: " + e.what());
    throw IoError(what + "; not repaired: " + e.what());
  }
  const std::vector<int64_t> still = seg.corrupt_blocks(*v);
  if (!still.empty()) {
    log_(str(what, "; ", still.size(), " still corrupt after decoding"));
    throw IoError(str(what, "; ", still.size(), " still corrupt after decoding from parity"));
  }
  log_(str(what, "; repaired from parity (", chunks.size(), " chunk(s)) in ", since(t0) * 1e3,
           " ms, when a read found them"));
  return {{"ok", true}, {"repaired", bad.size()}};
}

}  // namespace weft::launch
