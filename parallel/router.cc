// Transfer planning: box intersection with source preference (local, same host, least
// loaded replica), splitting into messages, waves under the memory budget and rounds in
// which each rank sends and receives at most once.
#include "parallel/router.h"

#include <algorithm>
#include <limits>
#include <map>
#include <tuple>

#include "base/check.h"
#include "base/error.h"

namespace weft::parallel {

using Coords = std::vector<int64_t>;

bool box_intersect(const Coords& as, const Coords& ae, const Coords& bs, const Coords& be,
                   Coords& start, Coords& extent) {
  const size_t n = as.size();
  start.assign(n, 0);
  extent.assign(n, 0);
  for (size_t d = 0; d < n; ++d) {
    int64_t lo = std::max(as[d], bs[d]), hi = std::min(as[d] + ae[d], bs[d] + be[d]);
    if (hi <= lo) return false;
    start[d] = lo, extent[d] = hi - lo;
  }
  return true;
}

namespace {

struct PlainBox {
  Coords start, extent;
};

// r minus its sub-box i: at most 2 * dims disjoint boxes.
std::vector<PlainBox> subtract(const PlainBox& r, const PlainBox& i) {
  std::vector<PlainBox> out;
  PlainBox rest = r;
  for (size_t d = 0; d < r.start.size(); ++d) {
    int64_t lo = i.start[d], hi = i.start[d] + i.extent[d];
    int64_t rlo = rest.start[d], rhi = rest.start[d] + rest.extent[d];
    if (lo > rlo) {
      PlainBox below = rest;
      below.extent[d] = lo - rlo;
      out.push_back(below);
    }
    if (hi < rhi) {
      PlainBox above = rest;
      above.start[d] = hi, above.extent[d] = rhi - hi;
      out.push_back(above);
    }
    rest.start[d] = lo, rest.extent[d] = hi - lo;
  }
  return out;
}

int64_t numel(const Coords& e) {
  int64_t n = 1;
  for (int64_t x : e) n *= x;
  return n;
}

// Splits a box into pieces of at most `cap` bytes: unit extents on the outer dims, bands of
// rows on the first dim whose rows fit.
void split_box(const PlainBox& b, size_t elem, int64_t cap, std::vector<PlainBox>& out,
               size_t dim = 0) {
  if (numel(b.extent) * int64_t(elem) <= cap) {
    out.push_back(b);
    return;
  }
  int64_t inner = 1;  // elements per index of `dim`
  for (size_t k = dim + 1; k < b.extent.size(); ++k) inner *= b.extent[k];
  if (inner * int64_t(elem) > cap) {
    for (int64_t i = 0; i < b.extent[dim]; ++i) {
      PlainBox s = b;
      s.start[dim] += i, s.extent[dim] = 1;
      split_box(s, elem, cap, out, dim + 1);
    }
    return;
  }
  int64_t rows = std::max<int64_t>(1, cap / (inner * int64_t(elem)));
  for (int64_t i = 0; i < b.extent[dim]; i += rows) {
    PlainBox s = b;
    s.start[dim] += i, s.extent[dim] = std::min(rows, b.extent[dim] - i);
    out.push_back(s);
  }
}

}  // namespace

namespace {

// Source boxes by state, grouped by identical region: region -> holders (rank, box index).
using Regions =
    std::map<StateId, std::map<std::pair<Coords, Coords>, std::vector<std::pair<int, int>>>>;

Regions index_sources(const Layout& a) {
  Regions regions;
  for (int q = 0; q < a.world(); ++q)
    for (size_t j = 0; j < a.ranks[size_t(q)].boxes.size(); ++j) {
      const StateBox& s = a.ranks[size_t(q)].boxes[j];
      regions[s.state][{s.start, s.extent}].push_back({q, int(j)});
    }
  return regions;
}

std::vector<Transfer> cover_indexed(const StateSpace& space, const Layout& a,
                                    const Regions& regions, const Layout& b, int dst,
                                    std::vector<int64_t>& load) {
  load.resize(size_t(std::max(a.world(), int(load.size()))), 0);
  auto tier = [&](int q) { return q == dst ? 0 : (a.host(q) == b.host(dst) ? 1 : 2); };

  std::vector<Transfer> out;
  const RankLayout& rl = b.ranks.at(size_t(dst));
  for (size_t k = 0; k < rl.boxes.size(); ++k) {
    const StateBox& d = rl.boxes[k];
    const size_t elem = core::dtype_size(space.at(d.state).dtype);
    // Candidate regions that meet the box, best tier first.
    struct Cand {
      int tier;
      const Coords *start, *extent;
      const std::vector<std::pair<int, int>>* holders;
    };
    std::vector<Cand> cands;
    Coords is, ie;
    auto rit = regions.find(d.state);
    if (rit != regions.end())
      for (const auto& [reg, holders] : rit->second) {
        if (!box_intersect(reg.first, reg.second, d.start, d.extent, is, ie)) continue;
        int t = 3;
        for (auto [q, j] : holders) t = std::min(t, tier(q));
        cands.push_back({t, &reg.first, &reg.second, &holders});
      }
    std::stable_sort(cands.begin(), cands.end(),
                     [](const Cand& x, const Cand& y) { return x.tier < y.tier; });
    std::vector<PlainBox> remaining{{d.start, d.extent}};
    for (const Cand& c : cands) {
      std::vector<PlainBox> next;
      for (const PlainBox& r : remaining) {
        if (!box_intersect(r.start, r.extent, *c.start, *c.extent, is, ie)) {
          next.push_back(r);
          continue;
        }
        Transfer t;
        t.state = d.state, t.start = is, t.extent = ie;
        t.dst = dst, t.dst_box = int(k);
        t.bytes = numel(ie) * int64_t(elem);
        // Best holder: lowest tier, then least load, then lowest rank.
        std::tuple<int, int64_t, int> best{4, 0, 0};
        for (auto [q, j] : *c.holders) {
          std::tuple<int, int64_t, int> key{tier(q), tier(q) == 0 ? 0 : load[size_t(q)], q};
          if (key < best) best = key, t.src = q, t.src_box = j;
        }
        if (!t.local()) load[size_t(t.src)] += t.bytes;
        out.push_back(std::move(t));
        for (PlainBox& p : subtract(r, {is, ie})) next.push_back(std::move(p));
      }
      remaining = std::move(next);
      if (remaining.empty()) break;
    }
    if (!remaining.empty()) {
      StateBox gap = d;
      gap.start = remaining[0].start, gap.extent = remaining[0].extent;
      throw InternalError("rank " + std::to_string(dst) + " needs " + box_str(space, gap) +
                          " but no rank holds it in the source layout");
    }
  }
  return out;
}

// The order in which states move. Between two states a rank holds the new tensors of the
// states moved so far and the old tensors of the others; what it holds at that point is the
// base every wave adds its destinations and staging to, so the base should not rise above the
// larger of the rank's two holdings (`cap`). When no rank has states that grow and others that
// shrink, any order keeps the base between its old and new holding: state order. Otherwise
// state order can stack the growth before the shrink (tp2 x dp2 -> dp4 ZeRO-1: every
// parameter grows from a half to a whole before the moments shrink from a half to a quarter,
// 0.9 GB above either holding on each rank of a 355M-parameter GPT), so the states go
// greedily: the lowest state that keeps every rank it touches within its cap, else the one
// that raises the highest excess least (the lowest of equals).
std::vector<StateId> memory_order(const StateSpace& space, const Layout& a, const Layout& b) {
  const size_t n = size_t(space.size()), world = size_t(a.world());
  std::vector<std::vector<int64_t>> delta(n, std::vector<int64_t>(world, 0));
  std::vector<int64_t> held(world, 0), cap(world, 0);
  for (size_t r = 0; r < world; ++r) {
    int64_t before = 0, after = 0;
    for (const LocalTensor& l : a.ranks[r].locals)
      delta[size_t(l.state)][r] -= l.bytes(), before += l.bytes();
    for (const LocalTensor& l : b.ranks[r].locals)
      delta[size_t(l.state)][r] += l.bytes(), after += l.bytes();
    held[r] = before, cap[r] = std::max(before, after);
  }
  std::vector<StateId> order(n);
  for (size_t s = 0; s < n; ++s) order[s] = StateId(s);
  bool mixed = false;
  for (size_t r = 0; r < world && !mixed; ++r) {
    bool grows = false, shrinks = false;
    for (size_t s = 0; s < n; ++s)
      grows = grows || delta[s][r] > 0, shrinks = shrinks || delta[s][r] < 0;
    mixed = grows && shrinks;
  }
  if (!mixed) return order;
  // The ranks each state changes, with the change.
  std::vector<std::vector<std::pair<size_t, int64_t>>> touches(n);
  for (size_t s = 0; s < n; ++s)
    for (size_t r = 0; r < world; ++r)
      if (delta[s][r] != 0) touches[s].push_back({r, delta[s][r]});
  order.clear();
  std::vector<char> done(n, 0);
  for (size_t taken = 0; taken < n; ++taken) {
    size_t pick = n;
    int64_t least = 0;
    for (size_t s = 0; s < n; ++s) {
      if (done[s]) continue;
      int64_t excess = std::numeric_limits<int64_t>::min();
      for (auto [r, d] : touches[s]) excess = std::max(excess, held[r] + d - cap[r]);
      if (excess <= 0) {
        pick = s;
        break;
      }
      if (pick == n || excess < least) pick = s, least = excess;
    }
    done[pick] = 1;
    order.push_back(StateId(pick));
    for (auto [r, d] : touches[pick]) held[r] += d;
  }
  return order;
}

}  // namespace

std::vector<Transfer> cover_rank(const StateSpace& space, const Layout& a, const Layout& b, int dst,
                                 std::vector<int64_t>& load) {
  return cover_indexed(space, a, index_sources(a), b, dst, load);
}

int64_t TransferPlan::bytes_remote() const {
  int64_t n = 0;
  for (const Transfer& t : transfers)
    if (!t.local()) n += t.bytes;
  return n;
}

int TransferPlan::rounds() const {
  int n = 0;
  for (const Wave& w : waves) n += int(w.rounds.size());
  return n;
}

TransferPlan transition(const StateSpace& space, const Layout& a, const Layout& b,
                        const RouterOptions& opt) {
  if (opt.budget_bytes < 64)
    throw InternalError("router budget of " + std::to_string(opt.budget_bytes) +
                        " bytes: need at least 64");
  if (a.world() != b.world())
    throw InternalError("transition between worlds of " + std::to_string(a.world()) + " and " +
                        std::to_string(b.world()) +
                        " ranks: remap both onto the union world first");
  const int world = a.world();
  TransferPlan plan;
  plan.budget_bytes = opt.budget_bytes;
  const int64_t cap = opt.budget_bytes / 4;

  // Cover, then split each remote transfer into message-sized pieces.
  std::vector<int64_t> load(size_t(world), 0);
  const Regions regions = index_sources(a);
  for (int r = 0; r < world; ++r)
    for (Transfer& t : cover_indexed(space, a, regions, b, r, load)) {
      if (t.local()) {
        plan.transfers.push_back(std::move(t));
        continue;
      }
      std::vector<PlainBox> parts;
      const size_t elem = core::dtype_size(space.at(t.state).dtype);
      split_box({t.start, t.extent}, elem, cap, parts);
      for (PlainBox& p : parts) {
        Transfer s = t;
        s.start = std::move(p.start), s.extent = std::move(p.extent);
        s.bytes = numel(s.extent) * int64_t(elem);
        plan.transfers.push_back(std::move(s));
      }
    }

  // Waves: consecutive states (in memory order) while every rank's new destination bytes stay
  // within budget/2.
  std::vector<std::vector<int64_t>> dst_bytes(size_t(space.size()),
                                              std::vector<int64_t>(size_t(world), 0));
  for (int r = 0; r < world; ++r)
    for (const LocalTensor& l : b.ranks[size_t(r)].locals)
      dst_bytes[size_t(l.state)][size_t(r)] += l.bytes();
  std::vector<int> wave_of(size_t(space.size()), 0);
  std::vector<int64_t> used(size_t(world), 0);
  for (StateId s : memory_order(space, a, b)) {
    bool fits = true;
    for (int r = 0; r < world; ++r)
      fits = fits && used[size_t(r)] + dst_bytes[size_t(s)][size_t(r)] <= opt.budget_bytes / 2;
    if (!fits && !plan.waves.empty() && !plan.waves.back().states.empty()) {
      plan.waves.emplace_back();
      std::fill(used.begin(), used.end(), 0);
    }
    if (plan.waves.empty()) plan.waves.emplace_back();
    plan.waves.back().states.push_back(s);
    wave_of[size_t(s)] = int(plan.waves.size()) - 1;
    for (int r = 0; r < world; ++r) used[size_t(r)] += dst_bytes[size_t(s)][size_t(r)];
  }

  // Messages per (wave, src, dst) pair, packed in transfer order up to `cap` bytes.
  std::vector<std::map<std::pair<int, int>, std::vector<Message>>> pairs(plan.waves.size());
  for (size_t i = 0; i < plan.transfers.size(); ++i) {
    const Transfer& t = plan.transfers[i];
    Wave& w = plan.waves[size_t(wave_of[size_t(t.state)])];
    if (t.local()) {
      w.local_copies.push_back(int(i));
      continue;
    }
    std::vector<Message>& ms = pairs[size_t(wave_of[size_t(t.state)])][{t.src, t.dst}];
    if (ms.empty() || ms.back().bytes + t.bytes > cap) ms.push_back(Message{t.src, t.dst, {}, 0});
    ms.back().transfers.push_back(int(i));
    ms.back().bytes += t.bytes;
  }

  // Rounds: earliest fit, taking the pairs' messages in turn so that rounds fill evenly;
  // a pair's messages keep their order (point-to-point messages match in issue order).
  for (size_t w = 0; w < plan.waves.size(); ++w) {
    std::vector<std::vector<char>> sending, receiving;  // per round, per rank
    std::map<std::pair<int, int>, int> next_round;
    size_t depth = 0;
    for (auto& [k, ms] : pairs[w]) depth = std::max(depth, ms.size());
    Wave& wave = plan.waves[w];
    for (size_t i = 0; i < depth; ++i)
      for (auto& [k, ms] : pairs[w]) {
        if (i >= ms.size()) continue;
        Message& m = ms[i];
        size_t round = size_t(next_round[k]);
        while (round < sending.size() &&
               (sending[round][size_t(m.src)] || receiving[round][size_t(m.dst)]))
          ++round;
        if (round == sending.size()) {
          sending.emplace_back(size_t(world), 0);
          receiving.emplace_back(size_t(world), 0);
          wave.rounds.emplace_back();
        }
        sending[round][size_t(m.src)] = receiving[round][size_t(m.dst)] = 1;
        next_round[k] = int(round) + 1;
        wave.rounds[round].messages.push_back(std::move(m));
      }
  }
  return plan;
}

std::vector<RankOp> rank_ops(const TransferPlan& plan, const Layout& a, const Layout& b, int rank) {
  const RankLayout& ra = a.ranks.at(size_t(rank));
  const RankLayout& rb = b.ranks.at(size_t(rank));
  // This rank's steps in plan order: its local copies of a wave (first), then each round of
  // the wave in which it sends or receives.
  struct Step {
    int wave = 0, copy = -1, round = -1;
    const Message *send = nullptr, *recv = nullptr;
    int si = -1, ri = -1;
  };
  std::vector<Step> steps;
  for (size_t w = 0; w < plan.waves.size(); ++w) {
    const Wave& wave = plan.waves[w];
    for (int t : wave.local_copies)
      if (plan.transfers[size_t(t)].dst == rank) steps.push_back({int(w), t});
    for (size_t r = 0; r < wave.rounds.size(); ++r) {
      Step st{int(w), -1, int(r)};
      for (size_t i = 0; i < wave.rounds[r].messages.size(); ++i) {
        const Message& m = wave.rounds[r].messages[i];
        if (m.src == rank) st.send = &m, st.si = int(i);
        if (m.dst == rank) st.recv = &m, st.ri = int(i);
      }
      if (st.send || st.recv) steps.push_back(st);
    }
  }
  // Each B local is allocated right before the step that first writes it and each A local
  // released right after the step that last reads it, so that a wave holds only what its
  // remaining steps need: a rank's peak is its base plus what is in flight, not plus the
  // whole wave's old and new tensors. (Sources go after the round's wait: a shared-memory
  // message is packed while the round completes.)
  std::vector<int> first_write(rb.locals.size(), -1), last_read(ra.locals.size(), -1);
  auto read = [&](int t, int i) {
    last_read[size_t(ra.boxes.at(size_t(plan.transfers[size_t(t)].src_box)).local)] = i;
  };
  auto write = [&](int t, int i) {
    int& f = first_write[size_t(rb.boxes.at(size_t(plan.transfers[size_t(t)].dst_box)).local)];
    if (f < 0) f = i;
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& st = steps[i];
    if (st.copy >= 0) read(st.copy, int(i)), write(st.copy, int(i));
    if (st.send)
      for (int t : st.send->transfers) read(t, int(i));
    if (st.recv)
      for (int t : st.recv->transfers) write(t, int(i));
  }
  std::vector<std::vector<int>> alloc_at(steps.size()), release_at(steps.size());
  for (size_t l = 0; l < rb.locals.size(); ++l)
    if (first_write[l] >= 0) alloc_at[size_t(first_write[l])].push_back(int(l));
  for (size_t l = 0; l < ra.locals.size(); ++l)
    if (last_read[l] >= 0) release_at[size_t(last_read[l])].push_back(int(l));

  std::vector<RankOp> ops;
  // Sources no transfer reads (a replica that another rank serves, state the new layout does
  // not keep here) go before anything is allocated.
  for (size_t l = 0; l < ra.locals.size(); ++l)
    if (last_read[l] < 0)
      ops.push_back({RankOp::kRelease, 0, -1, -1, int(l), ra.locals[l].bytes()});
  std::vector<char> in_wave;
  size_t next = 0;
  for (size_t w = 0; w < plan.waves.size(); ++w) {
    const Wave& wave = plan.waves[w];
    StateId top = 0;
    for (StateId s : wave.states) top = std::max(top, s);
    in_wave.assign(size_t(top) + 1, 0);
    for (StateId s : wave.states) in_wave[size_t(s)] = 1;
    auto member = [&](StateId s) { return s < StateId(in_wave.size()) && in_wave[size_t(s)]; };
    // A B local that no transfer writes (no element of it is state) is allocated with its wave.
    for (size_t l = 0; l < rb.locals.size(); ++l)
      if (first_write[l] < 0 && member(rb.locals[l].state))
        ops.push_back({RankOp::kAlloc, int(w), -1, -1, int(l), rb.locals[l].bytes()});
    for (; next < steps.size() && steps[next].wave == int(w); ++next) {
      const Step& st = steps[next];
      for (int l : alloc_at[next])
        ops.push_back({RankOp::kAlloc, int(w), st.round, -1, l, rb.locals[size_t(l)].bytes()});
      if (st.copy >= 0) {
        ops.push_back(
            {RankOp::kCopy, int(w), -1, rank, st.copy, plan.transfers[size_t(st.copy)].bytes});
      } else {
        RankOp s{RankOp::kSend, int(w),
                 st.round,      st.send ? st.send->dst : -1,
                 st.si,         st.send ? st.send->bytes : 0};
        RankOp v{RankOp::kRecv, int(w),
                 st.round,      st.recv ? st.recv->src : -1,
                 st.ri,         st.recv ? st.recv->bytes : 0};
        if (st.send && st.recv) {
          if (st.send->dst < rank)
            ops.push_back(v), ops.push_back(s);
          else
            ops.push_back(s), ops.push_back(v);
        } else if (st.send) {
          ops.push_back(s);
        } else {
          ops.push_back(v);
        }
        ops.push_back({RankOp::kWait, int(w), st.round, -1, -1, 0});
      }
      for (int l : release_at[next])
        ops.push_back({RankOp::kRelease, int(w), st.round, -1, l, ra.locals[size_t(l)].bytes()});
    }
  }
  return ops;
}

std::vector<int> adopted_locals(const TransferPlan& plan, const Layout& a, const Layout& b,
                                int rank) {
  const RankLayout& ra = a.ranks.at(size_t(rank));
  const RankLayout& rb = b.ranks.at(size_t(rank));
  // Per B local: -2 nothing seen yet, -1 not adoptable, else the one A local feeding it.
  std::vector<int> from(rb.locals.size(), -2);
  std::vector<int64_t> covered(rb.locals.size(), 0);
  for (const Transfer& t : plan.transfers) {
    if (t.dst != rank) continue;
    const StateBox& db = rb.boxes.at(size_t(t.dst_box));
    int& f = from.at(size_t(db.local));
    if (f == -1) continue;
    if (!t.local()) {
      f = -1;
      continue;
    }
    const StateBox& sb = ra.boxes.at(size_t(t.src_box));
    const bool identical = sb.start == db.start && sb.extent == db.extent &&
                           sb.local_start == db.local_start && t.start == db.start &&
                           t.extent == db.extent;
    if (!identical || (f >= 0 && f != sb.local)) {
      f = -1;
      continue;
    }
    f = sb.local;
    covered[size_t(db.local)] += numel(t.extent);
  }
  std::vector<int> out(rb.locals.size(), -1);
  std::vector<char> taken(ra.locals.size(), 0);
  for (size_t l = 0; l < rb.locals.size(); ++l) {
    const int f = from[l];
    if (f < 0) continue;
    const LocalTensor &x = ra.locals.at(size_t(f)), &y = rb.locals[l];
    if (x.state != y.state || x.shape != y.shape || x.dtype != y.dtype ||
        covered[l] != core::shape_numel(y.shape) || taken[size_t(f)])
      continue;
    taken[size_t(f)] = 1;
    out[l] = f;
  }
  return out;
}

RankMemory rank_memory(const TransferPlan& plan, const Layout& a, const Layout& b, int rank) {
  const RankLayout& ra = a.ranks.at(size_t(rank));
  const RankLayout& rb = b.ranks.at(size_t(rank));
  const std::vector<int> adopt = adopted_locals(plan, a, b, rank);
  std::vector<char> adopted_src(ra.locals.size(), 0);
  for (int f : adopt)
    if (f >= 0) adopted_src[size_t(f)] = 1;
  RankMemory m;
  for (const LocalTensor& l : ra.locals) m.before += l.bytes();
  for (const LocalTensor& l : rb.locals) m.after += l.bytes();
  // Staging as run_transition keeps it: one buffer per direction, of the largest message,
  // from the first message in that direction to the end.
  const std::vector<RankOp> ops = rank_ops(plan, a, b, rank);
  int64_t send_cap = 0, recv_cap = 0;
  for (const RankOp& op : ops) {
    if (op.kind == RankOp::kSend) send_cap = std::max(send_cap, op.bytes);
    if (op.kind == RankOp::kRecv) recv_cap = std::max(recv_cap, op.bytes);
  }
  bool sending = false, receiving = false;
  int64_t held = m.before;
  m.peak = held;
  for (const RankOp& op : ops) {
    switch (op.kind) {
      case RankOp::kAlloc:
        if (adopt[size_t(op.index)] < 0) held += op.bytes;
        break;
      case RankOp::kRelease:  // an adopted source lives on as its B tensor
        if (!adopted_src[size_t(op.index)]) held -= op.bytes;
        break;
      case RankOp::kSend:
        if (op.bytes > 0 && !sending) held += send_cap, sending = true;
        break;
      case RankOp::kRecv:
        if (op.bytes > 0 && !receiving) held += recv_cap, receiving = true;
        break;
      case RankOp::kWait:
      case RankOp::kCopy:
        break;
    }
    m.peak = std::max(m.peak, held);
  }
  return m;
}

}  // namespace weft::parallel
