// Transfer planning: box intersection with source preference (local, same host, least
// loaded replica), splitting into messages, waves under the memory budget and rounds in
// which each rank sends and receives at most once.
#include "parallel/router.h"

#include <algorithm>
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

  // Waves: consecutive states while every rank's new destination bytes stay within budget/2.
  std::vector<std::vector<int64_t>> dst_bytes(size_t(space.size()),
                                              std::vector<int64_t>(size_t(world), 0));
  for (int r = 0; r < world; ++r)
    for (const LocalTensor& l : b.ranks[size_t(r)].locals)
      dst_bytes[size_t(l.state)][size_t(r)] += l.bytes();
  std::vector<int> wave_of(size_t(space.size()), 0);
  std::vector<int64_t> used(size_t(world), 0);
  for (StateId s = 0; s < space.size(); ++s) {
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
  std::vector<RankOp> ops;
  std::vector<char> in_wave;
  for (size_t w = 0; w < plan.waves.size(); ++w) {
    const Wave& wave = plan.waves[w];
    StateId top = 0;
    for (StateId s : wave.states) top = std::max(top, s);
    in_wave.assign(size_t(top) + 1, 0);
    for (StateId s : wave.states) in_wave[size_t(s)] = 1;
    auto member = [&](StateId s) { return s < StateId(in_wave.size()) && in_wave[size_t(s)]; };
    const RankLayout& rb = b.ranks.at(size_t(rank));
    for (size_t l = 0; l < rb.locals.size(); ++l)
      if (member(rb.locals[l].state))
        ops.push_back({RankOp::kAlloc, int(w), -1, -1, int(l), rb.locals[l].bytes()});
    for (int t : wave.local_copies)
      if (plan.transfers[size_t(t)].dst == rank)
        ops.push_back({RankOp::kCopy, int(w), -1, rank, t, plan.transfers[size_t(t)].bytes});
    for (size_t r = 0; r < wave.rounds.size(); ++r) {
      const Message *send = nullptr, *recv = nullptr;
      int si = -1, ri = -1;
      for (size_t i = 0; i < wave.rounds[r].messages.size(); ++i) {
        const Message& m = wave.rounds[r].messages[i];
        if (m.src == rank) send = &m, si = int(i);
        if (m.dst == rank) recv = &m, ri = int(i);
      }
      RankOp s{RankOp::kSend, int(w), int(r), send ? send->dst : -1, si, send ? send->bytes : 0};
      RankOp v{RankOp::kRecv, int(w), int(r), recv ? recv->src : -1, ri, recv ? recv->bytes : 0};
      if (send && recv) {
        if (send->dst < rank)
          ops.push_back(v), ops.push_back(s);
        else
          ops.push_back(s), ops.push_back(v);
      } else if (send) {
        ops.push_back(s);
      } else if (recv) {
        ops.push_back(v);
      }
      if (send || recv) ops.push_back({RankOp::kWait, int(w), int(r), -1, -1, 0});
    }
    const RankLayout& ra = a.ranks.at(size_t(rank));
    for (size_t l = 0; l < ra.locals.size(); ++l)
      if (member(ra.locals[l].state))
        ops.push_back({RankOp::kRelease, int(w), -1, -1, int(l), ra.locals[l].bytes()});
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

}  // namespace weft::parallel
