// Running a transfer plan: one rank walks its ops (rank_ops), packs each outgoing message
// from its source tensors, unpacks each incoming one into its destination tensors,
// allocates each destination right before its first write and frees each source right after
// its last read. Same-host messages go through
// shared memory (parallel/shm_channel.h), packed straight into its slots; the others through
// the communicator's staging tensors. Adopted tensors (router.h) are neither allocated nor
// copied.
//
// Deadlock freedom with two transports: a round's communicator sends and receives are posted
// (never blocking, by the Communicator contract) before its shared-memory exchange, which
// progresses both directions in one loop and only waits on this round's peers; the
// communicator's operations progress without this thread. So the rule of rank_ops (no cycle
// of waits within a round, rounds in order) holds for each transport and for the mix.
//
// Striped messages (TransitionOptions::connections): a large communicator-bound message is
// cut into stripes, one per connection, all posted (never blocking) before the round's wait.
// Both ends cut it alike and skip the same empty stripes, so each connection carries a
// subsequence of the round-ordered point-to-point operations of rank_ops, between the same
// pairs in the same order: the rule above holds for each connection on its own, each
// progresses on its own threads, and a rank waiting on all of a round's stripes waits on
// operations that are all posted, on every rank, before anybody waits. So no cycle forms.
//
// Acknowledgements (TransitionOptions::acknowledge) add waits outside the rounds: a sender
// that must free memory (an allocation, the end) waits for the acknowledgement of a message
// of an earlier round, which its receiver posts right after that round's wait, never
// blocking (the matching receive was posted with the message). Take the stuck rank whose
// need is earliest, a rank in a round's wait needing that round and one awaiting an
// acknowledgement needing its receiver past the message's round: the receiver is then stuck
// in that round or earlier, so the earliest need is a round's wait whose peers are all in
// that round (an earlier need would be earlier), where the rule above holds. So no cycle
// forms with them either.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <tuple>

#include "base/check.h"
#include "base/error.h"
#include "base/log.h"
#include "parallel/router.h"
#include "parallel/shm_channel.h"

namespace weft::parallel {

void copy_box(void* dst, const std::vector<int64_t>& dst_shape,
              const std::vector<int64_t>& dst_start, const void* src,
              const std::vector<int64_t>& src_shape, const std::vector<int64_t>& src_start,
              const std::vector<int64_t>& extent, size_t elem) {
  const size_t n = extent.size();
  if (n == 0) {
    std::memcpy(dst, src, elem);
    return;
  }
  for (int64_t e : extent)
    if (e <= 0) return;
  // Row-major strides in elements; rows of the innermost dim are contiguous.
  std::vector<int64_t> ds(n, 1), ss(n, 1);
  for (size_t d = n - 1; d > 0; --d)
    ds[d - 1] = ds[d] * dst_shape[d], ss[d - 1] = ss[d] * src_shape[d];
  const size_t row = size_t(extent[n - 1]) * elem;
  std::vector<int64_t> idx(n, 0);
  auto* out = static_cast<char*>(dst);
  const auto* in = static_cast<const char*>(src);
  while (true) {
    int64_t doff = 0, soff = 0;
    for (size_t d = 0; d < n; ++d)
      doff += (dst_start[d] + idx[d]) * ds[d], soff += (src_start[d] + idx[d]) * ss[d];
    std::memcpy(out + doff * int64_t(elem), in + soff * int64_t(elem), row);
    size_t d = n - 1;
    while (d-- > 0) {
      if (++idx[d] < extent[d]) break;
      idx[d] = 0;
    }
    if (d == size_t(-1)) return;
  }
}

namespace {

// Minor page faults the calling thread has taken (its own, not its process's: the router's
// thread and nothing beside it).
int64_t thread_minor_faults() {
  rusage ru{};
  return ::getrusage(RUSAGE_THREAD, &ru) == 0 ? int64_t(ru.ru_minflt) : 0;
}

// `x` with `digits` decimals.
std::string fixed(double x, int digits) {
  char b[32];
  std::snprintf(b, sizeof b, "%.*f", digits, x);
  return b;
}

std::vector<int64_t> local_coords(const StateBox& b, const std::vector<int64_t>& global) {
  std::vector<int64_t> out(global.size());
  for (size_t d = 0; d < global.size(); ++d) out[d] = global[d] - b.start[d] + b.local_start[d];
  return out;
}

// One end of transfer `t` in a local tensor of A or B.
struct Endpoint {
  char* data;
  std::vector<int64_t> shape, start;
};

Endpoint src_end(const Layout& a, const Transfer& t, const std::vector<core::Tensor>& src) {
  const StateBox& sb = a.ranks[size_t(t.src)].boxes.at(size_t(t.src_box));
  const core::Tensor& x = src.at(size_t(sb.local));
  if (!x.defined())
    throw InternalError("router: source tensor " + std::to_string(sb.local) +
                        " was released before its last use");
  return {static_cast<char*>(x.raw_data()), x.shape(), local_coords(sb, t.start)};
}

Endpoint dst_end(const Layout& b, const Transfer& t, const std::vector<core::Tensor>& dst) {
  const StateBox& db = b.ranks[size_t(t.dst)].boxes.at(size_t(t.dst_box));
  const core::Tensor& x = dst.at(size_t(db.local));
  WEFT_CHECK(x.defined(), "router: destination tensor ", db.local, " not allocated");
  return {static_cast<char*>(x.raw_data()), x.shape(), local_coords(db, t.start)};
}

size_t elem_of(const Transfer& t) {
  int64_t n = 1;
  for (int64_t e : t.extent) n *= e;
  return size_t(t.bytes / std::max<int64_t>(1, n));
}

// Bytes [begin, end) of box `extent` at `e.start` of tensor `e`, packed row-major, to
// (`pack`) or from `packed`, which holds byte `begin` first. A chunk may start or end in
// the middle of a row.
void box_bytes(const Endpoint& e, const std::vector<int64_t>& extent, size_t elem, int64_t begin,
               int64_t end, char* packed, bool pack) {
  const size_t n = extent.size();
  const int64_t row = (n ? extent[n - 1] : 1) * int64_t(elem);
  if (row <= 0 || begin >= end) return;
  std::vector<int64_t> stride(n, 1);  // of the tensor, in elements
  for (size_t d = n; d-- > 1;) stride[d - 1] = stride[d] * e.shape[d];
  // idx: the row's index over the outer dims (all but the last).
  std::vector<int64_t> idx(n ? n - 1 : 0, 0);
  int64_t r = begin / row, off = begin % row;
  for (size_t d = idx.size(); d-- > 0;) idx[d] = r % extent[d], r /= extent[d];
  while (begin < end) {
    int64_t at = n ? e.start[n - 1] : 0;
    for (size_t d = 0; d < idx.size(); ++d) at += (e.start[d] + idx[d]) * stride[d];
    char* t = e.data + at * int64_t(elem) + off;
    const int64_t len = std::min(row - off, end - begin);
    if (pack)
      std::memcpy(packed, t, size_t(len));
    else
      std::memcpy(t, packed, size_t(len));
    packed += len, begin += len, off = 0;
    for (size_t d = idx.size(); d-- > 0;) {
      if (++idx[d] < extent[d]) break;
      idx[d] = 0;
    }
  }
}

// A message's transfers with their tensor ends, to pack or unpack any byte range of it.
class MessageBytes {
 public:
  MessageBytes(const TransferPlan& plan, const Message& m, const Layout& layout,
               const std::vector<core::Tensor>& tensors, bool sending) {
    int64_t at = 0;
    for (int ti : m.transfers) {
      const Transfer& t = plan.transfers[size_t(ti)];
      parts_.push_back({&t, sending ? src_end(layout, t, tensors) : dst_end(layout, t, tensors), at,
                        elem_of(t)});
      at += t.bytes;
    }
  }
  // Bytes [offset, offset + n) of the message to or from `buf`.
  void move(int64_t offset, char* buf, int64_t n, bool pack) {
    if (next_ >= parts_.size() || parts_[next_].at > offset) next_ = 0;  // chunks go forward
    for (; n > 0 && next_ < parts_.size(); ++next_) {
      const Part& p = parts_[next_];
      const int64_t end = p.at + p.t->bytes;
      if (end <= offset) continue;
      const int64_t len = std::min(n, end - offset);
      box_bytes(p.end, p.t->extent, p.elem, offset - p.at, offset - p.at + len, buf, pack);
      buf += len, offset += len, n -= len;
      if (offset < end) break;  // the chunk ended inside this transfer
    }
  }

 private:
  struct Part {
    const Transfer* t;
    Endpoint end;
    int64_t at;  // offset in the message
    size_t elem;
  };
  std::vector<Part> parts_;
  size_t next_ = 0;
};

// A destination tensor; one that its boxes cover completely is written in full by the
// transfers, so it is not zeroed first (a pass over fresh memory saved).
core::Tensor new_local(const RankLayout& rb, size_t l, memory::Allocator* alloc) {
  const LocalTensor& lt = rb.locals[l];
  int64_t covered = 0;
  for (const StateBox& box : rb.boxes)
    if (box.local == int(l)) covered += box.numel();  // boxes of one local are disjoint
  return covered == core::shape_numel(lt.shape) ? core::Tensor::empty(lt.shape, lt.dtype, alloc)
                                                : core::Tensor::zeros(lt.shape, lt.dtype, alloc);
}

bool same_host(const Layout& a, const Layout& b, int s, int d) {
  return a.host(s) == a.host(d) && b.host(s) == b.host(d);
}

// The shared-memory channels this plan needs, or null: collective over `comm` when the
// plan has a same-host message (every rank finds the same).
std::unique_ptr<ShmTransport> connect_shm(const TransferPlan& plan, const Layout& a,
                                          const Layout& b, comm::Communicator& comm,
                                          const TransitionOptions& opt) {
  const int w = a.world();
  if (!opt.shared_memory || comm.size() != w) return nullptr;
  std::vector<int64_t> largest(size_t(w) * size_t(w), 0);
  bool any = false;
  for (const Wave& wave : plan.waves)
    for (const Round& round : wave.rounds)
      for (const Message& m : round.messages)
        if (m.bytes > 0 && m.src != m.dst && same_host(a, b, m.src, m.dst)) {
          int64_t& l = largest[size_t(m.src) * size_t(w) + size_t(m.dst)];
          l = std::max(l, m.bytes), any = true;
        }
  if (!any) return nullptr;
  return std::make_unique<ShmTransport>(comm, largest,
                                        ShmOptions{opt.shm_chunk_bytes, opt.shm_slots});
}

// Point-to-point tags: a round's messages in the lower half, their acknowledgements in the
// upper (a pair may exchange messages both ways in a round, and a receive matches the first
// send of its tag: the two must not share one).
constexpr int kDataTags = (comm::kMaxTag + 1) / 2;
int data_tag(int round) { return round % kDataTags; }
int ack_tag(int round) { return kDataTags + round % kDataTags; }

// What an acknowledgement carries: the message's wave and round, checked by the sender.
int64_t ack_value(int wave, int round) { return (int64_t(wave) << 32) | int64_t(round); }

// The communicator messages that their receiver acknowledges (TransitionOptions::acknowledge),
// of those rank `rank` sends or receives. A sender needs to know that a message arrived only
// for the sources it frees (those no destination adopts: they live on), and only by the time
// it must hold less: its next allocation (run_transition waits there while the sources
// awaiting acknowledgements would raise it above what it may hold) or its end. A receiver unpacks a
// pair's messages in round order, so one acknowledgement covers every earlier message of the
// pair. So of the messages of a pair that are the last to read some such source, only the
// last before each of the sender's allocations, and the last of all, are acknowledged; a
// source waits for the first acknowledged message of each pair at or after its last reader
// there. A move of many messages from one rank that allocates nothing meanwhile waits for one
// acknowledgement per receiver. Both ends of a message find the same (the plan, the layouts
// and the transports are the same on every rank; the receiver replays its senders' ops).
struct Acks {
  std::vector<std::vector<int>> base;     // [wave][round]: the id of the round's first message
  std::vector<char> acked;                // by message id (plan order)
  std::vector<std::vector<int>> sources;  // by message id: the sender's sources that wait for it
  std::vector<int> due;                   // by A local of `rank`: the acknowledgements it waits for
  int id(int wave, int round, int index) const { return base[size_t(wave)][size_t(round)] + index; }
};

Acks acknowledged(const TransferPlan& plan, const Layout& a, const Layout& b, int rank,
                  const std::function<bool(const Message&)>& via_comm) {
  Acks acks;
  int n = 0;
  for (const Wave& wave : plan.waves) {
    acks.base.emplace_back();
    for (const Round& round : wave.rounds) {
      acks.base.back().push_back(n);
      n += int(round.messages.size());
    }
  }
  acks.acked.assign(size_t(n), 0);
  acks.sources.resize(size_t(n));
  acks.due.assign(a.ranks[size_t(rank)].locals.size(), 0);
  // The senders whose messages concern this rank: itself and those that send it any.
  std::vector<char> sender(size_t(a.world()), 0);
  sender[size_t(rank)] = 1;
  for (const Wave& wave : plan.waves)
    for (const Round& round : wave.rounds)
      for (const Message& m : round.messages)
        if (m.dst == rank && via_comm(m)) sender[size_t(m.src)] = 1;
  for (int s = 0; s < a.world(); ++s) {
    if (!sender[size_t(s)]) continue;
    std::vector<char> adopted(a.ranks[size_t(s)].locals.size(), 0);
    for (int from : adopted_locals(plan, a, b, s))
      if (from >= 0) adopted[size_t(from)] = 1;
    // s's communicator sends in issue order, each with the count of allocations before it.
    struct Sent {
      int id, dst, allocs;
      const Message* m;
    };
    std::vector<Sent> sent;
    int allocs = 0;
    bool receiving = false;
    for (const RankOp& op : rank_ops(plan, a, b, s)) {
      if (op.kind == RankOp::kAlloc) ++allocs;
      if (op.kind != RankOp::kSend && op.kind != RankOp::kRecv) continue;
      const Message& m =
          plan.waves[size_t(op.wave)].rounds[size_t(op.round)].messages[size_t(op.index)];
      if (!via_comm(m)) continue;
      if (op.kind == RankOp::kRecv) {  // the first allocates the incoming staging buffer
        allocs += receiving ? 0 : 1, receiving = true;
        continue;
      }
      if (s == rank || m.dst == rank)
        sent.push_back({acks.id(op.wave, op.round, op.index), m.dst, allocs, &m});
    }
    // Per receiver: the last message that reads each freed source.
    std::map<std::pair<int, int>, size_t> last;  // (dst, local) -> index into `sent`
    for (size_t k = 0; k < sent.size(); ++k)
      for (int ti : sent[k].m->transfers) {
        const int l = a.ranks[size_t(s)].boxes[size_t(plan.transfers[size_t(ti)].src_box)].local;
        if (!adopted[size_t(l)]) last[{sent[k].dst, l}] = k;
      }
    std::vector<std::vector<int>> freed(sent.size());  // sources whose last reader it is
    for (const auto& [key, k] : last) freed[k].push_back(key.second);
    // Per receiver, those readers in order: one is acknowledged when the pair's next comes
    // after an allocation of the sender's, or none comes; it covers those since the last.
    std::vector<size_t> next(sent.size(), sent.size());  // the pair's next such reader
    std::map<int, size_t> after;                         // dst -> the one seen last (backwards)
    for (size_t k = sent.size(); k-- > 0;) {
      if (freed[k].empty()) continue;
      auto it = after.find(sent[k].dst);
      if (it != after.end()) next[k] = it->second;
      after[sent[k].dst] = k;
    }
    std::map<int, std::vector<int>> waiting;  // dst -> sources awaiting the next acknowledged
    for (size_t k = 0; k < sent.size(); ++k) {
      if (freed[k].empty()) continue;
      std::vector<int>& w = waiting[sent[k].dst];
      w.insert(w.end(), freed[k].begin(), freed[k].end());
      if (next[k] == sent.size() || sent[next[k]].allocs > sent[k].allocs) {
        if (s == rank)
          for (int l : w) ++acks.due[size_t(l)];
        acks.acked[size_t(sent[k].id)] = 1;
        acks.sources[size_t(sent[k].id)] = std::move(w);
        w.clear();
      }
    }
  }
  return acks;
}

}  // namespace

std::vector<core::Tensor> run_transition(const TransferPlan& plan, const Layout& a, const Layout& b,
                                         int rank, std::vector<core::Tensor>& src,
                                         comm::Communicator& comm, const TransitionOptions& opt,
                                         TransitionStats* stats, Arrived* arrived_out) {
  const RankLayout& ra = a.ranks.at(size_t(rank));
  const RankLayout& rb = b.ranks.at(size_t(rank));
  if (src.size() != ra.locals.size())
    throw InternalError("router: rank " + std::to_string(rank) + " passed " +
                        std::to_string(src.size()) + " source tensors, its layout has " +
                        std::to_string(ra.locals.size()));
  for (size_t l = 0; l < src.size(); ++l)
    if (src[l].defined() &&
        (src[l].shape() != ra.locals[l].shape || src[l].dtype() != ra.locals[l].dtype))
      throw InternalError("router: source tensor " + std::to_string(l) + " is " +
                          core::shape_str(src[l].shape()) + ", the layout says " +
                          core::shape_str(ra.locals[l].shape));
  for (size_t l = 0; l < src.size(); ++l) src[l] = src[l].defined() ? src[l].contiguous() : src[l];
  const std::vector<int> adopt = adopted_locals(plan, a, b, rank);
  std::vector<char> adopted(rb.locals.size(), 0);  // decided at the local's allocation
  TransitionStats st;
  using Clock = std::chrono::steady_clock;
  const auto started = Clock::now();
  const int64_t faults_before = thread_minor_faults();
  // Adds the time `f` takes to `into`.
  auto timed = [](double& into, auto&& f) {
    const auto t0 = Clock::now();
    f();
    into += std::chrono::duration<double>(Clock::now() - t0).count();
  };
  auto progress = [&] {
    if (opt.on_progress) opt.on_progress(st);
  };
  std::unique_ptr<ShmTransport> shm;
  timed(st.seconds_setup, [&] { shm = connect_shm(plan, a, b, comm, opt); });
  if (shm) st.bytes_shm_reserved = shm->bytes_reserved();
  // Bytes held in tensors (TransitionStats::bytes_held_peak); `adopter` marks the sources that
  // live on as a destination, whose release frees nothing.
  std::vector<char> adopter(src.size(), 0);
  int64_t held = 0;
  for (const core::Tensor& x : src) held += x.defined() ? int64_t(x.nbytes()) : 0;
  st.bytes_held_start = st.bytes_held_peak = held;
  auto hold = [&](int64_t n) {
    held += n;
    st.bytes_held_peak = std::max(st.bytes_held_peak, held);
  };
  auto via_shm = [&](const Message& m) { return shm && shm->usable(m.src, m.dst); };

  std::vector<core::Tensor> dst(rb.locals.size());
  // Bytes still to arrive in each B local: 0 once every transfer into it completed; and
  // which transfers into this rank completed (`landed`), for the boxes of a partly filled one
  // (Arrived) if the move stops. A transfer lands when its bytes are in the destination: a
  // local copy at once, a message's once unpacked (the acknowledgement, or the drain of the
  // shared-memory slots, keeps its source held until then).
  std::vector<int64_t> pending(rb.locals.size(), 0);
  std::vector<char> landed(plan.transfers.size(), 0);
  for (const Transfer& t : plan.transfers)
    if (t.dst == rank) pending[size_t(rb.boxes.at(size_t(t.dst_box)).local)] += t.bytes;
  auto land = [&](int ti) {
    const Transfer& t = plan.transfers[size_t(ti)];
    pending[size_t(rb.boxes[size_t(t.dst_box)].local)] -= t.bytes;
    landed[size_t(ti)] = 1;
  };
  auto arrived = [&](const Message& m) {
    for (int ti : m.transfers) land(ti);
  };
  // Communicator staging: one outgoing and one incoming buffer, each of this rank's largest such
  // message, allocated at its first use, reused by every round and dropped at the end. The
  // communicator's waiter thread drops its handle on a buffer a moment after the wait returns,
  // so a buffer per round (or one dropped before later allocations) could outlive its use
  // while the next is allocated: memory above what the plan's count says.
  core::Tensor send_stage, recv_stage, send_buf, recv_buf;
  int64_t send_cap = 0, recv_cap = 0;
  for (const Wave& wave : plan.waves)
    for (const Round& round : wave.rounds)
      for (const Message& m : round.messages) {
        if (m.bytes == 0 || via_shm(m)) continue;
        if (m.src == rank) send_cap = std::max(send_cap, m.bytes);
        if (m.dst == rank) recv_cap = std::max(recv_cap, m.bytes);
      }
  // Acknowledgements. Sent: the receiver's 8 bytes back for each message `acks` marks,
  // delivered by the end. Awaited: one per such message this rank sent, with the sources that
  // wait for it; each source waits for `acks_due` of them (Acks::due). A source whose kRelease
  // comes while some are due stays in `src` (`release_due`) until the last came, and `held`
  // counts it until then. An allocation that would raise `held` above what the rank may hold
  // (`held_cap`) first waits for the oldest acknowledgements that a released source awaits.
  const auto via_comm = [&](const Message& m) {
    return m.bytes > 0 && m.src != m.dst && !via_shm(m);
  };
  const Acks acks = opt.acknowledge ? acknowledged(plan, a, b, rank, via_comm) : Acks{};
  struct Awaited {
    comm::Work ack;
    core::Tensor value;
    int64_t expect = 0;
    int peer = -1;
    const std::vector<int>* sources = nullptr;
  };
  std::deque<Awaited> awaited;
  std::vector<comm::Work> acks_out;
  std::vector<int> acks_due = opt.acknowledge ? acks.due : std::vector<int>(src.size(), 0);
  std::vector<char> release_due(src.size(), 0);
  // What the rank may hold: the router's promise (the larger holding plus the budget), or the
  // plan's own peak where one state alone exceeds that (router.h).
  const RankMemory plan_memory = opt.acknowledge ? rank_memory(plan, a, b, rank) : RankMemory{};
  const int64_t held_cap = std::max(plan_memory.peak, plan_memory.bound(plan.budget_bytes));
  auto release = [&](int l) {
    core::Tensor& x = src[size_t(l)];
    if (x.defined() && !adopter[size_t(l)]) hold(-int64_t(x.nbytes()));
    x = core::Tensor();
  };
  // Waits for acknowledgement `k` (done already, or the oldest that frees a source), frees what
  // it allows and drops it.
  auto settle_one = [&](size_t k) {
    Awaited& f = awaited[k];
    f.ack.wait();
    const int64_t got = *f.value.data<int64_t>();
    if (got != f.expect)
      throw InternalError(str("router: rank ", rank, " got acknowledgement ", got, " from rank ",
                              f.peer, ", expected ", f.expect, " (wave << 32 | round)"));
    for (int l : *f.sources)
      if (--acks_due[size_t(l)] == 0 && release_due[size_t(l)]) release(l);
    awaited.erase(awaited.begin() + std::ptrdiff_t(k));
  };
  // Frees what the acknowledgements that came allow, never waiting.
  auto collect = [&] {
    for (size_t k = 0; k < awaited.size();)
      if (awaited[k].ack.done())
        settle_one(k);
      else
        ++k;
  };
  // Before allocating `need` bytes: also waits while the sources awaiting acknowledgements
  // would raise the rank above `held_cap`, for the oldest one that a released source awaits.
  auto settle = [&](int64_t need) {
    collect();
    while (held + need > held_cap) {
      size_t k = 0;
      auto frees = [&](const Awaited& f) {
        for (int l : *f.sources)
          if (release_due[size_t(l)]) return true;  // its last one, or one of them
        return false;
      };
      while (k < awaited.size() && !frees(awaited[k])) ++k;
      if (k == awaited.size()) break;
      ++st.ack_waits;
      settle_one(k);
    }
  };
  auto stage = [&](core::Tensor& buf, int64_t cap, int64_t n) {
    if (!buf.defined()) {
      settle(cap);
      buf = core::Tensor::empty({cap}, core::DType::kU8, opt.staging);
      hold(cap);
      st.bytes_staging += cap;
    }
    return buf.slice(0, 0, n);
  };
  // The connections a message is striped over: the communicator first (a message too small
  // to cut goes on it alone), then the extra ones.
  std::vector<comm::Communicator*> links = {&comm};
  for (comm::Communicator* c : opt.connections) {
    WEFT_CHECK(c != nullptr && c->size() == comm.size() && c->rank() == comm.rank(),
               "router: an extra connection's communicator must have the members of the "
               "communicator (rank ",
               comm.rank(), " of ", comm.size(), ")");
    links.push_back(c);
  }
  auto stripes = [&](const Message& m) {
    return m.bytes >= opt.stripe_min_bytes ? int64_t(links.size()) : int64_t(1);
  };
  // Posts stripe i of n of `buf` (m.bytes long) on links[i]; empty stripes (a message shorter
  // than n bytes) are skipped at both ends.
  auto post = [&](const Message& m, const core::Tensor& buf, int round, bool sending,
                  std::vector<comm::Work>& works) {
    const int64_t n = stripes(m);
    const int tag = data_tag(round);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t lo = m.bytes * i / n, hi = m.bytes * (i + 1) / n;
      if (hi == lo) continue;
      core::Tensor part = n == 1 ? buf : buf.slice(0, lo, hi - lo);
      works.push_back(sending ? links[size_t(i)]->send(part, m.dst, {.tag = tag})
                              : links[size_t(i)]->recv(part, m.src, {.tag = tag}));
    }
  };
  std::vector<comm::Work> send_work, recv_work;
  bool out_striped = false;
  const Message *incoming = nullptr, *shm_out = nullptr, *shm_in = nullptr;
  int incoming_id = -1;  // its message id (Acks) when acknowledgements are on
  int64_t comm_out = 0;
  try {
    for (const RankOp& op : rank_ops(plan, a, b, rank)) {
      switch (op.kind) {
        case RankOp::kAlloc: {
          const size_t l = size_t(op.index);
          const int from = adopt[l];
          if (from >= 0 && src[size_t(from)].defined()) {
            dst[l] = src[size_t(from)];  // shares the storage; kRelease drops only src's handle
            adopted[l] = 1, adopter[size_t(from)] = 1;
            pending[l] = 0;  // complete from the start: its copies are skipped
            st.bytes_adopted += rb.locals[l].bytes();
          } else {
            settle(rb.locals[l].bytes());
            dst[l] = new_local(rb, l, opt.destinations);
            hold(int64_t(dst[l].nbytes()));
            st.bytes_allocated += int64_t(dst[l].nbytes());
          }
          break;
        }
        case RankOp::kCopy: {
          const Transfer& t = plan.transfers[size_t(op.index)];
          if (adopted[size_t(rb.boxes[size_t(t.dst_box)].local)]) break;
          Endpoint s = src_end(a, t, src), d = dst_end(b, t, dst);
          timed(st.seconds_local_copy, [&] {
            copy_box(d.data, d.shape, d.start, s.data, s.shape, s.start, t.extent, elem_of(t));
          });
          land(op.index);
          st.bytes_copied += t.bytes;
          progress();
          break;
        }
        case RankOp::kSend: {
          const Message& m =
              plan.waves[size_t(op.wave)].rounds[size_t(op.round)].messages[size_t(op.index)];
          if (m.bytes == 0) break;  // both ends know it from the plan
          if (via_shm(m)) {
            shm_out = &m;
            break;
          }
          send_buf = stage(send_stage, send_cap, m.bytes);
          MessageBytes(plan, m, a, src, true)
              .move(0, static_cast<char*>(send_buf.raw_data()), m.bytes, true);
          if (const int id = opt.acknowledge ? acks.id(op.wave, op.round, op.index) : -1;
              id >= 0 && acks.acked[size_t(id)]) {
            // Posted before the message, so that the receiver's acknowledgement never waits.
            Awaited w;
            w.value = core::Tensor::zeros({1}, core::DType::kI64);
            w.expect = ack_value(op.wave, op.round);
            w.peer = m.dst;
            w.sources = &acks.sources[size_t(id)];
            w.ack = comm.recv(w.value, m.dst, {.tag = ack_tag(op.round)});
            awaited.push_back(std::move(w));
            ++st.acks_awaited;
          }
          post(m, send_buf, op.round, true, send_work);
          comm_out = m.bytes;
          out_striped = stripes(m) > 1;
          break;
        }
        case RankOp::kRecv: {
          const Message& m =
              plan.waves[size_t(op.wave)].rounds[size_t(op.round)].messages[size_t(op.index)];
          if (m.bytes == 0) break;
          if (via_shm(m)) {
            shm_in = &m;
            break;
          }
          incoming = &m;
          incoming_id = opt.acknowledge ? acks.id(op.wave, op.round, op.index) : -1;
          recv_buf = stage(recv_stage, recv_cap, m.bytes);
          post(m, recv_buf, op.round, false, recv_work);
          break;
        }
        case RankOp::kWait: {
          if (opt.before_wait) opt.before_wait(op.wave, op.round, incoming ? incoming : shm_in);
          if (shm_out || shm_in) {
            std::optional<MessageBytes> out, in;
            ShmTransport::Send s;
            ShmTransport::Recv r;
            if (shm_out) {
              out.emplace(plan, *shm_out, a, src, true);
              s = {shm_out->dst, shm_out->bytes,
                   [&](int64_t at, char* buf, int64_t n) {
                     timed(st.seconds_packing, [&] { out->move(at, buf, n, true); });
                   }};
            }
            if (shm_in) {
              in.emplace(plan, *shm_in, b, dst, false);
              r = {shm_in->src, shm_in->bytes, [&](int64_t at, const char* buf, int64_t n) {
                     timed(st.seconds_unpacking,
                           [&] { in->move(at, const_cast<char*>(buf), n, false); });
                   }};
            }
            // The incoming message lands with its last chunk, before anything that may throw
            // (progress(), or the exchange still waiting on its own send): its sender counts it
            // delivered once the slots are drained and frees the source then, so a receiver
            // that failed after that point and did not report it would lose it.
            int64_t shm_got = 0;
            shm->exchange(shm_out ? &s : nullptr, shm_in ? &r : nullptr,
                          [&](int64_t sent, int64_t got) {
                            st.bytes_sent_shm += sent, st.bytes_received_shm += got;
                            if (got > 0 && (shm_got += got) == shm_in->bytes) arrived(*shm_in);
                            progress();
                          });
          }
          for (comm::Work& w : recv_work) w.wait();
          for (comm::Work& w : send_work) w.wait();
          if (out_striped) st.bytes_sent_striped += comm_out;
          if (comm_out) st.bytes_sent_comm += comm_out, progress();
          if (incoming) {
            if (stripes(*incoming) > 1) st.bytes_received_striped += incoming->bytes;
            MessageBytes(plan, *incoming, b, dst, false)
                .move(0, static_cast<char*>(recv_buf.raw_data()), incoming->bytes, false);
            arrived(*incoming);
            st.bytes_received_comm += incoming->bytes;
            if (incoming_id >= 0 && acks.acked[size_t(incoming_id)]) {
              core::Tensor v =
                  core::Tensor::from_vector<int64_t>({1}, {ack_value(op.wave, op.round)});
              acks_out.push_back(comm.send(v, incoming->src, {.tag = ack_tag(op.round)}));
              ++st.acks_sent;
            }
            progress();
          }
          collect();                                // whatever acknowledgements came meanwhile
          for (size_t i = 0; i < acks_out.size();)  // those delivered: their Works go
            if (acks_out[i].done()) {
              acks_out[i].wait();  // rethrows a failed one
              acks_out[i] = std::move(acks_out.back()), acks_out.pop_back();
            } else {
              ++i;
            }
          incoming = shm_out = shm_in = nullptr;
          comm_out = 0;
          out_striped = false;
          send_buf = recv_buf = core::Tensor();
          send_work.clear(), recv_work.clear();
          break;
        }
        case RankOp::kRelease: {
          // A source that awaits acknowledgements stays held until they came.
          if (acks_due[size_t(op.index)] == 0)
            release(op.index);
          else
            release_due[size_t(op.index)] = 1;
          break;
        }
      }
    }
    while (!awaited.empty()) settle_one(0);
    for (comm::Work& w : acks_out) w.wait();
  } catch (...) {
    if (shm) shm->abort();
    st.seconds = std::chrono::duration<double>(Clock::now() - started).count();
    st.page_faults = thread_minor_faults() - faults_before;
    if (stats) *stats = st;
    if (arrived_out) {
      // Whole tensors, and the landed boxes of the partly filled ones: the only copy of a
      // box whose source was freed (a local copy's, or an acknowledged message's).
      Arrived& out = *arrived_out;
      out.tensors.assign(dst.size(), core::Tensor());
      out.partial.assign(dst.size(), {});
      for (size_t l = 0; l < dst.size(); ++l)
        if (dst[l].defined() && pending[l] == 0) out.tensors[l] = dst[l];
      for (size_t ti = 0; ti < plan.transfers.size(); ++ti) {
        if (!landed[ti]) continue;
        const Transfer& t = plan.transfers[ti];
        const StateBox& db = rb.boxes[size_t(t.dst_box)];
        const size_t l = size_t(db.local);
        if (pending[l] == 0) continue;  // whole
        StateBox piece;
        piece.state = t.state;
        piece.start = t.start, piece.extent = t.extent;
        piece.local = db.local;
        piece.local_start = local_coords(db, t.start);
        out.partial[l].push_back(std::move(piece));
        out.tensors[l] = dst[l];
      }
    }
    throw;
  }
  hold(-int64_t(send_stage.defined() ? send_cap : 0) -
       int64_t(recv_stage.defined() ? recv_cap : 0));
  send_stage = recv_stage = core::Tensor();
  st.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  st.page_faults = thread_minor_faults() - faults_before;
  if (stats) *stats = st;
  // Which transport carried what (WEFT_LOG_LEVEL=debug WEFT_LOG_SUBSYS=router): the resize
  // line reports only the plan's totals; tests of ranks on different hosts check that nothing
  // crossed shared memory.
  WEFT_DEBUG("router", "router transition (rank ", rank, "): ", st.bytes_sent_comm, " B out, ",
             st.bytes_received_comm, " B in through the communicator; ", st.bytes_sent_shm,
             " B out, ", st.bytes_received_shm, " B in through shared memory; ",
             st.bytes_sent_striped, " B out, ", st.bytes_received_striped, " B in striped over ",
             links.size(), " connections; ", st.bytes_adopted, " B adopted, ", st.bytes_copied,
             " B copied; ", fixed(st.seconds, 3), " s, of which shared-memory setup ",
             fixed(st.seconds_setup, 3), " (until the last rank reached the move), local copies ",
             fixed(st.seconds_local_copy, 3), ", packing ", fixed(st.seconds_packing, 3),
             ", unpacking ", fixed(st.seconds_unpacking, 3), ", waiting in the rounds ",
             fixed(std::max(0.0, st.seconds - st.seconds_setup - st.seconds_local_copy -
                                     st.seconds_packing - st.seconds_unpacking),
                   3),
             "; ", st.page_faults, " page faults");
  return dst;
}

}  // namespace weft::parallel
