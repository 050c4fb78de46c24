// A* over explicit layouts with the RVD primitive moves.
#include "planner/rvd.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <queue>
#include <sstream>
#include <tuple>
#include <unordered_map>

#include "base/check.h"
#include "planner/rvd_bound.h"

namespace weft::planner {
namespace {

void put(std::string& k, int64_t v) { k.append(reinterpret_cast<const char*>(&v), sizeof v); }

std::string piece_key(const Piece& p) {
  std::string k;
  put(k, p.part);
  put(k, p.parts);
  put(k, int64_t(p.reduce));
  for (const DimSlice& s : p.box) {
    put(k, s.start);
    put(k, s.size);
    put(k, s.count);
    put(k, s.stride);
  }
  return k;
}

std::string layout_key(const GroupLayout& l) {
  std::string k;
  for (const Piece& p : l) k += piece_key(p);
  return k;
}

// Chunk index and split factor of a slice within a dim of extent W (relative coordinates).
bool chunk_pos(const DimSlice& s, int64_t W, int64_t* c, int64_t* D) {
  if (s.size <= 0) return false;
  if (s.count == 1) {
    if (W % s.size || s.start % s.size) return false;
    *D = W / s.size;
    *c = s.start / s.size;
    return true;
  }
  if (s.stride * s.count != W || s.stride % s.size || s.start % s.size || s.start + s.size > s.stride)
    return false;
  *D = s.stride / s.size;
  *c = s.start / s.size;
  return true;
}

// A layout's hash (FNV-1a over every field of every piece): the search finds a layout it has
// seen by hash, then by comparing pieces, without building a key string per move.
uint64_t layout_hash(const GroupLayout& l) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](int64_t v) { h = (h ^ uint64_t(v)) * 1099511628211ull; };
  for (const Piece& p : l) {
    mix(p.part), mix(p.parts), mix(int64_t(p.reduce));
    for (const DimSlice& s : p.box) mix(s.start), mix(s.size), mix(s.count), mix(s.stride);
  }
  return h;
}

struct Search {
  const Box& whole;  // relative: starts at 0
  const std::vector<std::optional<Piece>>& need;
  int64_t elem;
  const CostModel& cm;
  bool cross;
  int n;
  // Members are `blocks` copies of one device list, block-major (member b * bs + p: the
  // device at position p of data-parallel replica b). Plans store one program per device
  // for replica 0 and shift it for the others, so a collective's team must be what a group
  // family can name: inside one block, or the same positions of every block, block-major.
  int blocks = 1;
  int ragged = -1;  // the ragged dim, -1: none
  int world = 0;    // the plan's ranks: a collective's fixed part is priced at it

  // A collective as the simulator prices it at `world`, but for processor sharing: its launch,
  // launch_oversub where the node runs more ranks than cores, its message steps, and its
  // bytes at one rank per core. The sharing the simulator applies to the bytes is a fixed
  // point of how many ranks compute at once, which the plan being made decides; priced at
  // its bound (every rank of the node computing: x256 at 512 ranks on 2 cores) it made
  // MoE gradients reduce-scatter inside a replica to save bytes across the replicas that
  // the simulation then charged far less for (docs/planner.md, "Where the instructions come
  // from"). Local copies likewise at one rank per core.
  double collective(CollKind k, int f, int64_t b) const {
    return cm.collective(k, f, b, cross) + cm.launch_oversub * cm.oversub_weight(world);
  }
  double copy(int64_t b) const { return cm.local_copy(b); }

  bool team_ok(const std::vector<int>& team) const {
    if (blocks == 1) return true;
    const int bs = n / blocks;
    bool inside = true;
    for (int m : team) inside = inside && m / bs == team[0] / bs;
    if (inside) return true;
    if (team.size() % size_t(blocks)) return false;
    const size_t k = team.size() / size_t(blocks);
    for (size_t j = 0; j < k; ++j)
      if (team[j] >= bs) return false;
    for (size_t b = 1; b < size_t(blocks); ++b)
      for (size_t j = 0; j < k; ++j)
        if (team[b * k + j] != int(b) * bs + team[j]) return false;
    return true;
  }
  // False when no team of f members is one a group family can name (f > a block's members and
  // not a multiple of the blocks): the collectives of that factor need not be formed at all.
  bool team_factor(int f) const { return blocks == 1 || f <= n / blocks || f % blocks == 0; }
  bool teams_ok(const std::vector<std::vector<int>>& t) const {
    for (const auto& team : t)
      if (!team_ok(team)) return false;
    return true;
  }

  int64_t bytes(const Piece& p) const { return p.numel() * elem; }
  int64_t max_bytes(const GroupLayout& l) const {
    int64_t b = 0;
    for (const Piece& p : l) b = std::max(b, bytes(p));
    return b;
  }

  // A*'s heuristic (planner/rvd_bound.h).
  double at_least(const GroupLayout& l) const {
    return rvd_lower_bound(l, need, whole, cm, cross, blocks, world);
  }

  bool satisfied(const GroupLayout& l, double* extra) const {
    int64_t copied = 0;
    for (int m = 0; m < n; ++m) {
      if (!need[size_t(m)]) continue;
      // A ragged piece's rows are known at run time: no static cut can take some of them.
      if (ragged >= 0 && !(l[size_t(m)] == *need[size_t(m)])) return false;
      if (!piece_extractable(l[size_t(m)], *need[size_t(m)])) return false;
      if (!(l[size_t(m)] == *need[size_t(m)])) copied = std::max(copied, bytes(*need[size_t(m)]));
    }
    *extra = copied ? copy(copied) : 0;
    return true;
  }

  // Teams of f members that share everything but a component indexed by u (0..f-1);
  // `key` returns the grouping key and u, or false when the member cannot join.
  template <typename KeyFn>
  bool teams(const std::vector<int>& rho, int f, KeyFn key,
             std::vector<std::vector<int>>& out) const {
    std::map<std::string, std::vector<std::pair<int64_t, int>>> by;
    for (int m = 0; m < n; ++m) {
      std::string k;
      int64_t u;
      if (!key(m, k, u)) return false;
      put(k, rho[size_t(m)]);
      by[k].push_back({u, m});
    }
    out.clear();
    for (auto& [k, v] : by) {
      if (int(v.size()) != f) return false;
      std::sort(v.begin(), v.end());
      std::vector<int> team;
      for (int i = 0; i < f; ++i) {
        if (v[size_t(i)].first != i) return false;
        team.push_back(v[size_t(i)].second);
      }
      out.push_back(team);
    }
    return true;
  }

  bool value_teams(const GroupLayout& l, const std::vector<int>& rho, int f,
                   std::vector<std::vector<int>>& t) const {
    return teams(rho, f, [&](int m, std::string& k, int64_t& u) {
      const Piece& p = l[size_t(m)];
      if (p.parts % f) return false;
      Piece q = p;
      q.part = p.part / f;
      k = piece_key(q);
      u = p.part % f;
      return true;
    }, t);
  }

  bool dim_teams(const GroupLayout& l, const std::vector<int>& rho, int f, int d,
                 std::vector<std::vector<int>>& t) const {
    return teams(rho, f, [&](int m, std::string& k, int64_t& u) {
      const Piece& p = l[size_t(m)];
      int64_t c, D;
      if (!chunk_pos(p.box[size_t(d)], whole[size_t(d)].size, &c, &D) || D % f) return false;
      Piece q = p;
      q.box[size_t(d)].start = (c / f) * f * p.box[size_t(d)].size;
      k = piece_key(q);
      u = c % f;
      return true;
    }, t);
  }

  std::optional<DimSlice> merge(const GroupLayout& l, const std::vector<int>& team, int d) const {
    std::optional<DimSlice> s = l[size_t(team[0])].box[size_t(d)];
    for (size_t i = 1; i < team.size() && s; ++i) s = s->merged(l[size_t(team[i])].box[size_t(d)]);
    return s;
  }

  void expand(const GroupLayout& l, std::vector<Move>& out) const {
    std::vector<int> factors;
    for (int f = 2; f <= n; ++f)
      if (n % f == 0) factors.push_back(f);
    int dims = int(whole.size());
    std::vector<std::vector<int64_t>> group_opts(size_t(dims), std::vector<int64_t>{1});
    for (int d = 0; d < dims; ++d) {
      auto add = [&](int64_t g) {
        auto& o = group_opts[size_t(d)];
        if (g > 1 && std::find(o.begin(), o.end(), g) == o.end()) o.push_back(g);
      };
      for (const Piece& p : l) add(p.box[size_t(d)].count);
      for (const auto& q : need)
        if (q) add(q->box[size_t(d)].count);
    }
    // Members holding equal pieces, in member order: rho numbers each one's copy (teams keep
    // copies apart), and a chunk cuts each set. Computed once for every move of this layout.
    std::map<std::string, std::vector<int>> by_piece;
    for (int m = 0; m < n; ++m) by_piece[piece_key(l[size_t(m)])].push_back(m);
    std::vector<int> rho(size_t(n), 0);
    std::vector<std::vector<int>> sets;
    for (auto& [k, members] : by_piece) {
      for (size_t r = 0; r < members.size(); ++r) rho[size_t(members[r])] = int(r);
      sets.push_back(std::move(members));
    }
    if (ragged >= 0) {
      std::vector<std::vector<int>> t;
      for (int f : factors)
        if (team_factor(f) && dim_teams(l, rho, f, ragged, t) && teams_ok(t))
          for (int64_t g : group_opts[size_t(ragged)]) all_to_all_v(l, t, f, g, out);
      return;
    }
    for (int f : factors) {
      std::vector<std::vector<int>> t;
      if (team_factor(f) && value_teams(l, rho, f, t)) {
        // A sum does not depend on its members' order: over blocks, the all-reduce's team is
        // listed in member order, which is block-major as a group family needs.
        std::vector<std::vector<int>> sorted = t;
        if (blocks > 1)
          for (auto& team : sorted) std::sort(team.begin(), team.end());
        // The all-reduce applies the addends' own operator: a V-max is combined by max, never
        // summed. Teams group equal keys, and the key holds the operator, so a team is of one
        // operator; a layout mixing operators across teams is not a move of one collective.
        const ReduceOp op = l[size_t(t[0][0])].reduce;
        bool one_op = true;
        for (const Piece& p : l) one_op = one_op && p.reduce == op;
        if (one_op && teams_ok(sorted)) {
          Move mv{MoveKind::kAllReduce, -1, -1, 1, f, sorted, l};
          mv.reduce = op;
          for (Piece& p : mv.after) {
            p.part /= f, p.parts /= f;
            if (p.parts == 1) p.reduce = ReduceOp::kSum;  // a whole value has no operator
          }
          mv.cost = collective(CollKind::kAllReduce, f, max_bytes(l));
          out.push_back(std::move(mv));
        }
        // Reduce-scatter sums (the executor and the collectives it calls scatter by sum only):
        // a V-max reaches a split only through its max all-reduce and a local chunk.
        if (one_op && op == ReduceOp::kSum)
          for (int d = 0; d < dims; ++d)
            for (int64_t g : group_opts[size_t(d)])
              for (int aligned = 0; aligned < 2; ++aligned) reduce_scatter(l, t, f, d, g, aligned, out);
      }
      for (int d = 0; d < dims; ++d) {
        if (team_factor(f) && dim_teams(l, rho, f, d, t) && teams_ok(t)) {
          std::vector<DimSlice> merged;  // per team
          for (const auto& team : t) {
            auto s = merge(l, team, d);
            if (!s) break;
            merged.push_back(*s);
          }
          if (merged.size() == t.size()) {
            Move mv{MoveKind::kAllGather, d, -1, l[0].box[size_t(d)].count, f, t, l};
            for (size_t i = 0; i < t.size(); ++i)
              for (int m : t[i]) mv.after[size_t(m)].box[size_t(d)] = merged[i];
            mv.cost = collective(CollKind::kAllGather, f, max_bytes(mv.after));
            out.push_back(std::move(mv));
          }
          for (int d2 = 0; d2 < dims; ++d2)
            if (d2 != d)
              for (int64_t g : group_opts[size_t(d2)]) all_to_all(l, t, f, d, d2, g, out);
        }
        for (int64_t g : group_opts[size_t(d)]) chunk(l, sets, f, d, g, out);
      }
    }
  }

  void reduce_scatter(const GroupLayout& l, const std::vector<std::vector<int>>& t, int f, int d,
                      int64_t g, bool aligned, std::vector<Move>& out) const {
    // The new slices are collected first and the layout copied only for a move that exists
    // (most candidates fail, and a layout of 512 members is 512 allocations).
    std::vector<std::pair<int, DimSlice>> cuts;
    std::vector<std::vector<int>> teams;
    for (const auto& team : t) {
      std::vector<int> order(size_t(f), -1);  // chunk x -> member
      for (int u = 0; u < f; ++u) {
        int m = team[size_t(u)];
        int64_t x = u;
        if (aligned) {
          if (!need[size_t(m)]) return;
          x = -1;
          for (int64_t c = 0; c < f && x < 0; ++c) {
            auto s = l[size_t(m)].box[size_t(d)].part(c, f, g);
            if (s && s->contains(need[size_t(m)]->box[size_t(d)])) x = c;
          }
          if (x < 0 || order[size_t(x)] >= 0) return;
        }
        auto s = l[size_t(m)].box[size_t(d)].part(x, f, g);
        if (!s) return;
        order[size_t(x)] = m;
        cuts.push_back({m, *s});
      }
      if (!team_ok(order)) return;
      teams.push_back(order);
    }
    Move mv{MoveKind::kReduceScatter, d, -1, g, f, std::move(teams), l};
    for (const auto& [m, slice] : cuts) {
      Piece& p = mv.after[size_t(m)];
      p.box[size_t(d)] = slice;
      p.part /= f;
      p.parts /= f;
    }
    mv.cost = collective(CollKind::kReduceScatter, f, max_bytes(l));
    out.push_back(std::move(mv));
  }

  void all_to_all(const GroupLayout& l, const std::vector<std::vector<int>>& t, int f, int d, int d2,
                  int64_t g, std::vector<Move>& out) const {
    std::vector<std::tuple<int, DimSlice, DimSlice>> cuts;  // member, its dim d, its dim d2
    for (const auto& team : t) {
      auto merged = merge(l, team, d);
      if (!merged) return;
      for (int u = 0; u < f; ++u) {
        int m = team[size_t(u)];
        auto s = l[size_t(m)].box[size_t(d2)].part(u, f, g);
        if (!s) return;
        cuts.push_back({m, *merged, *s});
      }
    }
    Move mv{MoveKind::kAllToAll, d, d2, g, f, t, l};
    for (const auto& [m, along, across] : cuts) {
      mv.after[size_t(m)].box[size_t(d)] = along;
      mv.after[size_t(m)].box[size_t(d2)] = across;
    }
    mv.cost = collective(CollKind::kAllToAll, f, max_bytes(l));
    out.push_back(std::move(mv));
  }

  // Regroups the ragged dim within each team: the team's chunks merged (the rows of all its
  // members, source-major) and split again as `g` groups, member u taking part u of every
  // group. From plain chunks to g = f this hands member u the block u of every member's rows
  // (their rows bound for u); from those back to g = 1 it returns them.
  void all_to_all_v(const GroupLayout& l, const std::vector<std::vector<int>>& t, int f, int64_t g,
                    std::vector<Move>& out) const {
    const int d = ragged;
    Move mv{MoveKind::kAllToAllV, d, -1, 1, f, t, l};
    for (const auto& team : t) {
      auto merged = merge(l, team, d);
      if (!merged) return;
      for (int u = 0; u < f; ++u) {
        auto s = merged->part(u, f, g);
        if (!s) return;
        mv.after[size_t(team[size_t(u)])].box[size_t(d)] = *s;
      }
    }
    if (mv.after == l) return;  // every member keeps its rows
    mv.cost = collective(CollKind::kAllToAllV, f, max_bytes(l));
    out.push_back(std::move(mv));
  }

  void chunk(const GroupLayout& l, const std::vector<std::vector<int>>& sets, int f, int d,
             int64_t g, std::vector<Move>& out) const {
    for (const auto& members : sets)
      if (members.size() % size_t(f)) return;
    Move mv{MoveKind::kChunk, d, -1, g, f, {}, l};
    for (const auto& members : sets) {
      for (size_t r = 0; r < members.size(); ++r) {
        auto s = l[size_t(members[r])].box[size_t(d)].part(int64_t(r % size_t(f)), f, g);
        if (!s) return;
        mv.after[size_t(members[r])].box[size_t(d)] = *s;
      }
    }
    mv.cost = copy(max_bytes(mv.after));
    out.push_back(std::move(mv));
  }
};

Piece shift(Piece p, const Box& whole, int sign) {
  for (size_t d = 0; d < p.box.size(); ++d) p.box[d].start += sign * whole[d].start;
  return p;
}

// Layouts the search expands before it gives up.
constexpr int kSearchBudget = 4000;

RvdPath search(const GroupLayout& from, const std::vector<std::optional<Piece>>& need,
               const Box& whole, int64_t elem, const CostModel& cm, bool cross, int blocks,
               int ragged, int world) {
  Search s{whole, need, elem, cm, cross, int(from.size()), blocks, ragged, world};
  std::vector<GroupLayout> states{from};
  std::vector<std::pair<int, Move>> parent{{-1, Move{}}};
  std::vector<double> best{0};
  std::unordered_multimap<uint64_t, int> ids{{layout_hash(from), 0}};
  // A*: a state is ordered by its cost so far plus at_least(); a goal by its whole cost.
  using Item = std::tuple<double, int, bool>;  // ordering cost, state, goal
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> pq;
  pq.push({s.at_least(from), 0, false});
  std::vector<char> done(1, 0);
  int pops = 0;
  bool exhausted = false;
  while (!pq.empty()) {
    auto [f, id, goal] = pq.top();
    pq.pop();
    if (goal) {
      const double c = f;
      RvdPath path;
      path.cost = c;
      path.layouts = pops;
      for (int at = id; parent[size_t(at)].first >= 0; at = parent[size_t(at)].first)
        path.moves.push_back(parent[size_t(at)].second);
      std::reverse(path.moves.begin(), path.moves.end());
      return path;
    }
    if (done[size_t(id)]) continue;
    done[size_t(id)] = 1;
    const double c = best[size_t(id)];
    if (++pops > kSearchBudget) {
      exhausted = true;
      break;
    }
    double extra;
    if (s.satisfied(states[size_t(id)], &extra)) pq.push({c + extra, id, true});
    std::vector<Move> moves;
    s.expand(states[size_t(id)], moves);
    for (Move& mv : moves) {
      double nc = c + mv.cost + 1e-9;  // a tie-break toward fewer moves
      const uint64_t h = layout_hash(mv.after);
      int nid = -1;
      for (auto [it, end] = ids.equal_range(h); it != end && nid < 0; ++it)
        if (states[size_t(it->second)] == mv.after) nid = it->second;
      if (nid < 0) {
        nid = int(states.size());
        ids.emplace(h, nid);
        states.push_back(mv.after);
        parent.push_back({id, mv});
        best.push_back(nc);
        done.push_back(0);
      } else {
        if (done[size_t(nid)] || nc >= best[size_t(nid)]) continue;
        best[size_t(nid)] = nc;
        parent[size_t(nid)] = {id, mv};
      }
      pq.push({nc + s.at_least(mv.after), nid, false});
    }
  }
  // Two different answers: every layout reachable by the primitive moves was tried and none
  // serves the need (impossible with these moves), or the search stopped at its budget (a
  // path may exist further out).
  std::ostringstream os;
  os << (exhausted ? "layout conversion search gave up after " + std::to_string(kSearchBudget) +
                         " layouts without reaching a path (a longer one may exist) from"
                   : "no layout conversion exists (every layout the primitive moves reach was "
                     "tried) from");
  for (const Piece& p : from) os << " " << piece_str(p);
  os << " to";
  for (const auto& p : need) os << " " << (p ? piece_str(*p) : "-");
  throw NotSupported(os.str());
}

}  // namespace

std::string Rvd::str() const {
  std::ostringstream os;
  os << "R" << r << " V" << v << (v > 1 && reduce == ReduceOp::kMax ? "max" : "") << " D(";
  for (size_t i = 0; i < d.size(); ++i) os << (i ? "," : "") << d[i];
  os << ")";
  return os.str();
}

std::optional<Rvd> rvd_of(const GroupLayout& l, const Box& whole) {
  if (l.empty()) return std::nullopt;
  Rvd r;
  r.v = l[0].parts;
  r.reduce = l[0].reduce;
  for (size_t d = 0; d < whole.size(); ++d) {
    int64_t c, D;
    DimSlice s = l[0].box[d];
    s.start -= whole[d].start;
    if (!chunk_pos(s, whole[d].size, &c, &D)) return std::nullopt;
    r.d.push_back(D);
  }
  int64_t distinct = r.v;
  for (int64_t D : r.d) distinct *= D;
  if (int64_t(l.size()) % distinct) return std::nullopt;
  r.r = int64_t(l.size()) / distinct;
  return r;
}

const char* move_name(MoveKind k) {
  switch (k) {
    case MoveKind::kAllReduce: return "all_reduce";
    case MoveKind::kAllGather: return "all_gather";
    case MoveKind::kReduceScatter: return "reduce_scatter";
    case MoveKind::kAllToAll: return "all_to_all";
    case MoveKind::kAllToAllV: return "all_to_all_v";
    case MoveKind::kChunk: return "chunk";
  }
  return "?";
}

CollKind move_collective(MoveKind k) {
  switch (k) {
    case MoveKind::kAllGather: return CollKind::kAllGather;
    case MoveKind::kReduceScatter: return CollKind::kReduceScatter;
    case MoveKind::kAllToAll: return CollKind::kAllToAll;
    case MoveKind::kAllToAllV: return CollKind::kAllToAllV;
    default: return CollKind::kAllReduce;
  }
}

size_t RvdCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return paths_.size();
}

std::optional<RvdPath> RvdCache::find(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = paths_.find(key);
  if (it == paths_.end()) return std::nullopt;
  return it->second;
}

void RvdCache::insert(const std::string& key, const RvdPath& path) {
  std::lock_guard<std::mutex> lock(mu_);
  paths_.emplace(key, path);
}

RvdPath rvd_search(const GroupLayout& from, const std::vector<std::optional<Piece>>& need,
                   const Box& whole, int64_t elem_bytes, const CostModel& cm, bool cross_node,
                   RvdCache* cache, int blocks, int ragged_dim, int world) {
  WEFT_CHECK(from.size() == need.size() && !from.empty(), "rvd_search: one need per member");
  WEFT_CHECK(ragged_dim < int(whole.size()), "rvd_search: ragged dim ", ragged_dim, " of a ",
             whole.size(), "-dim value");
  WEFT_CHECK(blocks >= 1 && from.size() % size_t(blocks) == 0, "rvd_search: ", from.size(),
             " members are not ", blocks, " equal blocks");
  for (const DimSlice& d : whole) WEFT_CHECK(d.count == 1, "rvd_search: whole must be a plain box");
  Box rel_whole = whole;
  for (DimSlice& d : rel_whole) d.start = 0;
  GroupLayout rel_from;
  std::vector<std::optional<Piece>> rel_need;
  for (const Piece& p : from) rel_from.push_back(shift(p, whole, -1));
  for (const auto& p : need) rel_need.push_back(p ? std::optional<Piece>(shift(*p, whole, -1)) : std::nullopt);
  std::string key = layout_key(rel_from) + "|";
  for (const auto& p : rel_need) key += p ? piece_key(*p) : std::string("-");
  for (const DimSlice& d : rel_whole) put(key, d.size);
  put(key, elem_bytes);
  put(key, cross_node);
  put(key, blocks);
  put(key, ragged_dim);
  // Every field of the cost model: the moves' costs read the CPU sharing terms too (cores,
  // ranks_per_node, op_overhead, launch_oversub, active_ranks), and a search under another
  // model must not get this one's path and costs. The world enters the prices only through
  // oversub_weight(), so that is keyed rather than the world: on GPUs (0 at every world), or
  // at any two worlds that both oversubscribe the node, one entry serves every world.
  for (double x : {cm.flops, cm.mem_bw, cm.launch, cm.alpha_intra, cm.bw_intra, cm.alpha_inter,
                   cm.bw_inter, cm.op_overhead, cm.launch_oversub, cm.active_ranks,
                   cm.oversub_weight(world)}) {
    int64_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    put(key, bits);
  }
  for (const auto& curve : cm.coll_bw_by_size) {  // the measured collective rates
    put(key, int64_t(curve.size()));
    for (const auto& [bytes, rate] : curve)
      for (double x : {bytes, rate}) {
        int64_t bits;
        std::memcpy(&bits, &x, sizeof bits);
        put(key, bits);
      }
  }
  put(key, cm.ranks_per_node);
  put(key, cm.cores);
  put(key, cm.device_memory);
  std::optional<RvdPath> hit = cache ? cache->find(key) : std::nullopt;
  RvdPath path = hit ? std::move(*hit)
                     : search(rel_from, rel_need, rel_whole, elem_bytes, cm, cross_node, blocks,
                              ragged_dim, world);
  if (cache && !hit) cache->insert(key, path);
  for (Move& mv : path.moves)
    for (Piece& p : mv.after) p = shift(p, whole, +1);
  return path;
}

}  // namespace weft::planner
