// Shared helpers of the VPS and router tests: tiny job specs and their plans, random
// layouts (uneven grids, replicas, ZeRO-like flat shards), and the checks every transfer
// plan must pass (exact cover, rounds, budget, a symbolic replay without wait cycles).
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/config/job_spec.h"
#include "parallel/router.h"
#include "parallel/vps.h"
#include "planner/planner.h"

namespace weft::parallel::test_util {

struct Degrees {
  int64_t dp = 1, tp = 1, pp = 1, ep = 1, zero = 0;
};

inline core::JobSpec tiny_spec(bool moe = false, int64_t experts = 4) {
  core::JobSpec s;
  s.model.arch = moe ? "moe-gpt" : "gpt";
  s.model.layers = 2, s.model.dim = 64, s.model.heads = 4, s.model.vocab = 256,
  s.model.seq_len = 16;
  if (moe) s.model.moe.experts = experts, s.model.moe.top_k = 2;
  s.data.path = "/usr/share/games/fortunes";
  s.train.global_batch = 8, s.train.micro_batch = 2;
  return s;
}

inline planner::Plan plan_for(core::JobSpec s, Degrees d) {
  s.parallel.dp = d.dp, s.parallel.tp = d.tp, s.parallel.pp = d.pp, s.parallel.ep = d.ep,
  s.parallel.zero = d.zero;
  planner::PlanOptions o;
  o.simulate = false;
  return planner::make_plan(s, int(d.dp * d.tp * d.pp * d.ep), o);
}

inline StateSpace space_for(const core::JobSpec& s) {
  return StateSpace::from_graph(planner::build_planning_graph(s).graph);
}

// Row-major flat index of a global coordinate.
inline int64_t flat_index(const core::Shape& shape, const std::vector<int64_t>& at) {
  int64_t f = 0;
  for (size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + at[d];
  return f;
}

// Calls fn(flat global index) for every element of a box.
template <typename F>
void for_each_element(const core::Shape& shape, const std::vector<int64_t>& start,
                      const std::vector<int64_t>& extent, F fn) {
  int64_t n = 1;
  for (int64_t e : extent) n *= e;
  std::vector<int64_t> at(start.size());
  for (int64_t i = 0; i < n; ++i) {
    int64_t rest = i;
    for (size_t d = start.size(); d-- > 0;) at[d] = start[d] + rest % extent[d], rest /= extent[d];
    fn(flat_index(shape, at));
  }
}

// A random state space of `n` tensors (1 to 3 dims, small) plus the scalars.
inline StateSpace random_space(std::mt19937_64& rng, int n) {
  core::Graph g;
  for (int i = 0; i < n; ++i) {
    core::Value v;
    v.name = "t" + std::to_string(i);
    int dims = 1 + int(rng() % 3);
    for (int d = 0; d < dims; ++d) v.shape.push_back(1 + int64_t(rng() % 9));
    v.dtype = i % 3 == 2 ? core::DType::kF64 : core::DType::kF32;
    v.role = core::Role::kParameter;
    v.persistent = true;
    g.add_value(v);
  }
  return StateSpace::from_graph(g);
}

// Random cut points of [0, n) into 1..k uneven parts.
inline std::vector<int64_t> random_cuts(std::mt19937_64& rng, int64_t n, int k) {
  std::set<int64_t> cuts{0, n};
  int parts = 1 + int(rng() % uint64_t(k));
  for (int i = 1; i < parts && n > 1; ++i) cuts.insert(1 + int64_t(rng() % uint64_t(n - 1)));
  return {cuts.begin(), cuts.end()};
}

// A random layout of `space` over `world` ranks: each tensor cut into an uneven grid or
// into flat ranges (ZeRO-like, each flat box its own local tensor), each piece held by 1..3
// ranks. Scalars everywhere. Covers everything.
inline Layout random_layout(std::mt19937_64& rng, const StateSpace& space, int world, int hosts) {
  Layout l;
  l.ranks.resize(size_t(world));
  for (int r = 0; r < world; ++r) l.hosts.push_back(r % std::max(1, hosts));
  auto holders = [&] {
    std::set<int> h;
    int k = 1 + int(rng() % 3);
    while (int(h.size()) < std::min(k, world)) h.insert(int(rng() % uint64_t(world)));
    return h;
  };
  auto add = [&](int r, StateId id, const std::vector<int64_t>& start,
                 const std::vector<int64_t>& extent) {
    RankLayout& rl = l.ranks[size_t(r)];
    rl.locals.push_back(LocalTensor{id, extent, space.at(id).dtype, -1});
    rl.boxes.push_back(StateBox{id, start, extent, int(rl.locals.size()) - 1,
                                std::vector<int64_t>(start.size(), 0)});
  };
  for (const StateTensor& t : space.tensors()) {
    if (t.kind == StateKind::kScalar) {
      for (int r = 0; r < world; ++r) add(r, t.id, {0}, {1});
      continue;
    }
    if (rng() % 3 == 0) {  // flat ranges
      std::vector<int64_t> cuts = random_cuts(rng, core::shape_numel(t.shape), 4);
      for (size_t i = 0; i + 1 < cuts.size(); ++i) {
        std::set<int> h = holders();
        for (auto& [start, extent] : flat_range_boxes(t.shape, cuts[i], cuts[i + 1]))
          for (int r : h) add(r, t.id, start, extent);
      }
      continue;
    }
    std::vector<std::vector<int64_t>> cuts;
    for (int64_t n : t.shape) cuts.push_back(random_cuts(rng, n, 3));
    std::vector<size_t> idx(t.shape.size(), 0);
    while (true) {
      std::vector<int64_t> start, extent;
      for (size_t d = 0; d < idx.size(); ++d)
        start.push_back(cuts[d][idx[d]]), extent.push_back(cuts[d][idx[d] + 1] - cuts[d][idx[d]]);
      for (int r : holders()) add(r, t.id, start, extent);
      size_t d = idx.size();
      while (d-- > 0) {
        if (++idx[d] + 1 < cuts[d].size()) break;
        idx[d] = 0;
      }
      if (d == size_t(-1)) break;
    }
  }
  assign_replicas(l);
  return l;
}

inline bool inside(const std::vector<int64_t>& s, const std::vector<int64_t>& e,
                   const StateBox& b) {
  for (size_t d = 0; d < s.size(); ++d)
    if (s[d] < b.start[d] || s[d] + e[d] > b.start[d] + b.extent[d]) return false;
  return true;
}

// Blocking-semantics replay of every rank's ops (each send and receive blocks until its
// peer's matching op is the peer's current op): "" or a description of the stuck ranks.
inline std::string replay(const TransferPlan& plan, const Layout& a, const Layout& b) {
  const int world = a.world();
  std::vector<std::vector<RankOp>> ops(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r)
    for (const RankOp& op : rank_ops(plan, a, b, r))
      if (op.kind == RankOp::kSend || op.kind == RankOp::kRecv) ops[size_t(r)].push_back(op);
  std::vector<size_t> pos(size_t(world), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < world; ++r) {
      if (pos[size_t(r)] >= ops[size_t(r)].size()) continue;
      const RankOp& op = ops[size_t(r)][pos[size_t(r)]];
      if (op.kind != RankOp::kSend) continue;
      const int p = op.peer;
      if (pos[size_t(p)] >= ops[size_t(p)].size()) continue;
      const RankOp& other = ops[size_t(p)][pos[size_t(p)]];
      if (other.kind != RankOp::kRecv || other.peer != r) continue;
      if (other.bytes != op.bytes)
        return "rank " + std::to_string(r) + " sends " + std::to_string(op.bytes) +
               " bytes, rank " + std::to_string(p) + " expects " + std::to_string(other.bytes);
      ++pos[size_t(r)], ++pos[size_t(p)];
      progress = true;
    }
  }
  std::string stuck;
  for (int r = 0; r < world; ++r)
    if (pos[size_t(r)] < ops[size_t(r)].size()) {
      const RankOp& op = ops[size_t(r)][pos[size_t(r)]];
      stuck += "rank " + std::to_string(r) + " blocked in " +
               (op.kind == RankOp::kSend ? "send to " : "recv from ") + std::to_string(op.peer) +
               " (wave " + std::to_string(op.wave) + " round " + std::to_string(op.round) + "); ";
    }
  return stuck;
}

// Every check on one transfer plan; failures are reported with `what`.
inline void check_plan(const StateSpace& space, const Layout& a, const Layout& b,
                       const TransferPlan& plan, const std::string& what) {
  SCOPED_TRACE(what);
  const int world = b.world();
  // 1. Each destination element exactly once, each transfer inside its two boxes.
  std::map<std::pair<int, int>, std::vector<int>>
      hits;  // (dst, box) -> count per element of the box
  for (int r = 0; r < world; ++r)
    for (size_t k = 0; k < b.ranks[size_t(r)].boxes.size(); ++k)
      hits[{r, int(k)}].assign(size_t(b.ranks[size_t(r)].boxes[k].numel()), 0);
  for (const Transfer& t : plan.transfers) {
    const StateBox& sb = a.ranks.at(size_t(t.src)).boxes.at(size_t(t.src_box));
    const StateBox& db = b.ranks.at(size_t(t.dst)).boxes.at(size_t(t.dst_box));
    ASSERT_EQ(sb.state, t.state);
    ASSERT_EQ(db.state, t.state);
    ASSERT_TRUE(inside(t.start, t.extent, sb)) << box_str(space, sb);
    ASSERT_TRUE(inside(t.start, t.extent, db)) << box_str(space, db);
    std::vector<int>& h = hits[{t.dst, t.dst_box}];
    std::vector<int64_t> rel(t.start.size());
    for (size_t d = 0; d < rel.size(); ++d) rel[d] = t.start[d] - db.start[d];
    for_each_element(db.extent, rel, t.extent, [&](int64_t f) { ++h[size_t(f)]; });
    // 2. Preference: no box on a better tier than the chosen source meets this transfer.
    auto tier = [&](int q) { return q == t.dst ? 0 : (a.host(q) == b.host(t.dst) ? 1 : 2); };
    for (int q = 0; q < a.world(); ++q) {
      if (tier(q) >= tier(t.src)) continue;
      for (const StateBox& o : a.ranks[size_t(q)].boxes) {
        std::vector<int64_t> is, ie;
        if (o.state == t.state && box_intersect(o.start, o.extent, t.start, t.extent, is, ie))
          ADD_FAILURE() << "rank " << t.dst << " takes " << box_str(space, db) << " from rank "
                        << t.src << " although rank " << q << " (a better tier) holds part of it";
      }
    }
  }
  for (auto& [k, h] : hits)
    for (size_t i = 0; i < h.size(); ++i)
      if (h[i] != 1) {
        ADD_FAILURE() << "rank " << k.first << " box "
                      << box_str(space, b.ranks[size_t(k.first)].boxes[size_t(k.second)])
                      << " element " << i << " filled " << h[i] << " times";
        return;
      }
  // 3. Rounds, messages and the budget.
  std::vector<int> placed(plan.transfers.size(), 0);
  for (size_t w = 0; w < plan.waves.size(); ++w) {
    const Wave& wave = plan.waves[w];
    std::set<StateId> states(wave.states.begin(), wave.states.end());
    std::vector<int64_t> dst_bytes(size_t(world), 0);
    for (int r = 0; r < world; ++r)
      for (const LocalTensor& l : b.ranks[size_t(r)].locals)
        if (states.count(l.state)) dst_bytes[size_t(r)] += l.bytes();
    if (wave.states.size() > 1) {
      for (int r = 0; r < world; ++r) {
        EXPECT_LE(dst_bytes[size_t(r)], plan.budget_bytes / 2) << "wave " << w;
      }
    }
    for (int t : wave.local_copies) {
      ++placed[size_t(t)];
      EXPECT_TRUE(plan.transfers[size_t(t)].local());
      EXPECT_TRUE(states.count(plan.transfers[size_t(t)].state));
    }
    for (const Round& round : wave.rounds) {
      std::set<int> senders, receivers;
      for (const Message& m : round.messages) {
        EXPECT_TRUE(senders.insert(m.src).second) << "rank " << m.src << " sends twice in a round";
        EXPECT_TRUE(receivers.insert(m.dst).second)
            << "rank " << m.dst << " receives twice in a round";
        EXPECT_LE(m.bytes, plan.budget_bytes / 4);
        int64_t sum = 0;
        for (int t : m.transfers) {
          const Transfer& x = plan.transfers[size_t(t)];
          ++placed[size_t(t)];
          sum += x.bytes;
          EXPECT_EQ(x.src, m.src);
          EXPECT_EQ(x.dst, m.dst);
          EXPECT_TRUE(states.count(x.state));
        }
        EXPECT_EQ(sum, m.bytes);
      }
    }
  }
  for (size_t t = 0; t < placed.size(); ++t)
    ASSERT_EQ(placed[t], 1) << "transfer " << t << " scheduled " << placed[t] << " times";
  // 4. Each rank's ops: sources of a wave released before the next wave allocates; staging
  // of a round within budget/2.
  for (int r = 0; r < world; ++r) {
    int alloc_wave = -1;  // the latest wave that allocated so far
    std::map<std::pair<int, int>, int64_t> staging;
    for (const RankOp& op : rank_ops(plan, a, b, r)) {
      if (op.kind == RankOp::kAlloc) alloc_wave = std::max(alloc_wave, op.wave);
      if (op.kind == RankOp::kRelease) {
        EXPECT_GE(op.wave, alloc_wave) << "rank " << r << " releases a source of wave " << op.wave
                                       << " after allocating wave " << alloc_wave;
      }
      if (op.kind == RankOp::kSend || op.kind == RankOp::kRecv)
        staging[{op.wave, op.round}] += op.bytes;
    }
    for (auto& [k, v] : staging)
      EXPECT_LE(v, plan.budget_bytes / 2) << "rank " << r << " wave " << k.first;
    // Each A local is live from the start until its kRelease, each B local from its kAlloc
    // on: every copy and message reads live sources and writes allocated destinations.
    const RankLayout &ra = a.ranks[size_t(r)], &rb = b.ranks[size_t(r)];
    std::vector<char> src_live(ra.locals.size(), 1), dst_live(rb.locals.size(), 0);
    auto uses = [&](int t) {
      const Transfer& x = plan.transfers[size_t(t)];
      if (x.src == r) {
        EXPECT_TRUE(src_live[size_t(ra.boxes[size_t(x.src_box)].local)])
            << "rank " << r << " reads a released source (transfer " << t << ")";
      }
      if (x.dst == r) {
        EXPECT_TRUE(dst_live[size_t(rb.boxes[size_t(x.dst_box)].local)])
            << "rank " << r << " writes an unallocated destination (transfer " << t << ")";
      }
    };
    for (const RankOp& op : rank_ops(plan, a, b, r)) {
      if (op.kind == RankOp::kAlloc) {
        EXPECT_FALSE(dst_live[size_t(op.index)]) << "rank " << r << " allocates twice";
        dst_live[size_t(op.index)] = 1;
      }
      if (op.kind == RankOp::kRelease) {
        EXPECT_TRUE(src_live[size_t(op.index)]) << "rank " << r << " releases twice";
        src_live[size_t(op.index)] = 0;
      }
      if (op.kind == RankOp::kCopy) uses(op.index);
      if ((op.kind == RankOp::kSend || op.kind == RankOp::kRecv) && op.index >= 0)
        for (int t : plan.waves[size_t(op.wave)]
                         .rounds[size_t(op.round)]
                         .messages[size_t(op.index)]
                         .transfers)
          uses(t);
    }
    for (size_t l = 0; l < rb.locals.size(); ++l)
      EXPECT_TRUE(dst_live[l]) << "rank " << r << " never allocates B local " << l;
    for (size_t l = 0; l < ra.locals.size(); ++l)
      EXPECT_FALSE(src_live[l]) << "rank " << r << " never releases A local " << l;
  }
  // 5. No wait cycle under blocking semantics.
  EXPECT_EQ(replay(plan, a, b), "");
}

}  // namespace weft::parallel::test_util
