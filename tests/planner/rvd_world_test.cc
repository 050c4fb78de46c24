// Phase 3's layout search prices its moves at the plan's world, as the simulator prices the
// collectives they become: on an oversubscribed CPU host (more ranks on a node than cores)
// every collective pays launch_oversub. Bytes are priced at one rank per core (the
// simulator's sharing is a fixed point of the finished plan). Priced at world 0 the search
// split a tensor-parallel all-reduce over 8 into three collectives that the simulator then
// charged more than the one it replaced.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <random>
#include <string>

#include "base/error.h"
#include "planner/engine.h"
#include "planner/rvd.h"
#include "planner/rvd_bound.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {

// A 2-core VM's calibration, as `weft calibrate` fitted it on the machine this was measured
// on (its values rounded): every rank on one node, a collective's launch 0.55 ms, a message
// step 0.34 ms, 2.6 ms more per collective while the node runs more ranks than cores.
CostModel vm_like() {
  CostModel cm;
  cm.flops = 6.27e10;
  cm.mem_bw = 1.42e10;
  cm.launch = 5.46e-4;
  cm.alpha_intra = cm.alpha_inter = 3.38e-4;
  cm.bw_intra = cm.bw_inter = 1.68e8;
  cm.ranks_per_node = 1 << 20;
  cm.cores = 2;
  cm.op_overhead = 2.17e-5;
  cm.launch_oversub = 2.6e-3;
  return cm;
}

// The simulator's prices where one rank per core computes (its processor-sharing fixed point
// at its low end): the search prices bytes so, and every other term at the plan's world.
CostModel one_rank_per_core(CostModel cm) {
  cm.active_ranks = cm.cores;
  return cm;
}

// What the simulator charges for a path's collectives at `world`: each move's collective over
// its factor, of the buffer the lowering gives it (an all-gather's output, else the input).
double simulator_price(const RvdPath& p, const GroupLayout& from, const CostModel& cm, int world) {
  double t = 0;
  const GroupLayout* before = &from;
  for (const Move& m : p.moves) {
    if (m.kind != MoveKind::kChunk) {
      const GroupLayout& buffers = m.kind == MoveKind::kAllGather ? m.after : *before;
      int64_t bytes = 0;
      for (const Piece& q : buffers) bytes = std::max(bytes, q.numel() * 4);
      t += cm.collective(move_collective(m.kind), m.factor, bytes, false, world);
    }
    before = &m.after;
  }
  return t;
}

const Box kActivation = full_box({64, 1024});  // 256 KiB of f32

// An activation summed over 8 tensor-parallel lanes, needed whole by each.
struct TpSum {
  GroupLayout from;
  std::vector<std::optional<Piece>> need;
};
TpSum tp_sum(int tp) {
  TpSum s;
  for (int m = 0; m < tp; ++m) {
    s.from.push_back(Piece{kActivation, m, tp});
    s.need.push_back(Piece{kActivation});
  }
  return s;
}

TEST(RvdWorld, ATpAllReduceOver8StaysOneAllReduceWhereTheSimulatorPricesTheSplitHigher) {
  const CostModel cm = vm_like();
  const TpSum s = tp_sum(8);
  // Unpriced by the world (or at one that does not oversubscribe the 2 cores), a split saves 6
  // message steps (2.0 ms) for 2 launches (1.1 ms): a reduce-scatter, an all-reduce over the
  // rest, an all-gather (over 4, 2, 4 or 2, 4, 2: the same steps), the same bytes as one
  // all-reduce. (Two all-reduces, over 4 then 2, move 43% more bytes: dearer at this size.)
  auto kinds = [](const RvdPath& p) {
    std::vector<std::string> out;
    for (const Move& m : p.moves)
      if (m.kind != MoveKind::kChunk) out.push_back(move_name(m.kind));
    return out;
  };
  const std::vector<std::string> split{"reduce_scatter", "all_reduce", "all_gather"};
  const RvdPath at0 = rvd_search(s.from, s.need, kActivation, 4, cm, false);
  EXPECT_EQ(kinds(at0), split);
  EXPECT_EQ(kinds(rvd_search(s.from, s.need, kActivation, 4, cm, false, nullptr, 1, -1, 2)), split);
  // At 512 ranks each launch also waits 2.6 ms for a core: one all-reduce.
  const RvdPath at512 = rvd_search(s.from, s.need, kActivation, 4, cm, false, nullptr, 1, -1, 512);
  EXPECT_EQ(test_util::collectives_of(at512), std::vector<std::string>{"all_reduce/8"});
  // The search's cost is what the simulator charges for it when one rank per core computes;
  // with more computing at once only the bytes cost more, and the split moves the same bytes.
  const CostModel sim = one_rank_per_core(cm);
  const int64_t bytes = box_numel(kActivation) * 4;
  const double one = sim.collective(CollKind::kAllReduce, 8, bytes, false, 512);
  EXPECT_NEAR(at512.cost, one, 1e-8);
  EXPECT_NEAR(simulator_price(at512, s.from, sim, 512), one, 1e-12);
  const double more = 2 * (cm.launch + cm.launch_oversub) - 6 * cm.alpha_intra;
  EXPECT_NEAR(simulator_price(at0, s.from, sim, 512) - one, more, 1e-9);
  EXPECT_NEAR(simulator_price(at0, s.from, cm, 512) - simulator_price(at512, s.from, cm, 512), more,
              1e-9);
  EXPECT_GT(cm.sharing(512), 100);  // every rank computing: bytes 256 times dearer
  // World 0 prices the split below the single all-reduce: the reason it was chosen.
  EXPECT_LT(at0.cost, cm.collective(CollKind::kAllReduce, 8, box_numel(kActivation) * 4, false));
}

TEST(RvdWorld, ACacheKeepsTheWorldsThatPriceDifferentlyApartAndSharesTheOnesThatDoNot) {
  const CostModel cm = vm_like();
  const TpSum s = tp_sum(8);
  RvdCache cache;
  rvd_search(s.from, s.need, kActivation, 4, cm, false, &cache, 1, -1, 0);
  // World 2 on 2 cores prices as world 0 (no sharing, no wait for a core): the same entry.
  rvd_search(s.from, s.need, kActivation, 4, cm, false, &cache, 1, -1, 2);
  EXPECT_EQ(cache.size(), 1u);
  const RvdPath at512 = rvd_search(s.from, s.need, kActivation, 4, cm, false, &cache, 1, -1, 512);
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(test_util::collectives_of(at512), std::vector<std::string>{"all_reduce/8"});
  // 64 ranks oversubscribe the cores too: the same prices, the same entry.
  rvd_search(s.from, s.need, kActivation, 4, cm, false, &cache, 1, -1, 64);
  EXPECT_EQ(cache.size(), 2u);
  // On GPUs the world changes no price: one entry for every world.
  const CostModel gpu;
  RvdCache gpu_cache;
  for (int world : {0, 8, 512, 4096})
    rvd_search(s.from, s.need, kActivation, 4, gpu, false, &gpu_cache, 1, -1, world);
  EXPECT_EQ(gpu_cache.size(), 1u);
}

// A layout of `n` members: R copies x V addends x D0 x D1 chunks, member index decomposed with
// the components in `order` (fastest first: 0 = R, 1 = V, 2 = D0, 3 = D1).
GroupLayout rvd_layout(const Box& whole, int n, const std::array<int, 4>& f,
                       const std::array<int, 4>& order) {
  GroupLayout l;
  for (int m = 0; m < n; ++m) {
    std::array<int, 4> idx{};
    int rest = m;
    for (int c : order) idx[size_t(c)] = rest % f[size_t(c)], rest /= f[size_t(c)];
    Piece p{whole, idx[1], f[1]};
    p.box[0] = *p.box[0].part(idx[2], f[2]);
    p.box[1] = *p.box[1].part(idx[3], f[3]);
    l.push_back(p);
  }
  return l;
}

// Factors of 8 members as R x V x D0 x D1, each a power of two (V stays 1 for a need).
std::array<int, 4> random_factors(std::mt19937& rng, bool addends) {
  const std::vector<int> components =
      addends ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{0, 2, 3};
  std::array<int, 4> f{1, 1, 1, 1};
  for (int k = 0; k < 3; ++k) f[size_t(components[rng() % components.size()])] *= 2;
  return f;
}

TEST(RvdWorld, TheBoundNeverExceedsTheSearchsOptimumOnRandomConversionsAtAnOversubscribedWorld) {
  const CostModel cm = vm_like();
  std::mt19937 rng(17);
  int searched = 0, lacking = 0;
  for (const Box& whole : {full_box({8, 16}), full_box({64, 256})})
    for (int world : {64, 512})
      for (int blocks : {1, 2})
        for (int trial = 0; trial < 12; ++trial) {
          std::array<int, 4> order{0, 1, 2, 3}, need_order{0, 1, 2, 3};
          std::shuffle(order.begin(), order.end(), rng);
          std::shuffle(need_order.begin(), need_order.end(), rng);
          const GroupLayout from = rvd_layout(whole, 8, random_factors(rng, true), order);
          const GroupLayout want = rvd_layout(whole, 8, random_factors(rng, false), need_order);
          std::vector<std::optional<Piece>> need(want.begin(), want.end());
          SCOPED_TRACE("world " + std::to_string(world) + ", " + std::to_string(blocks) +
                       " blocks, trial " + std::to_string(trial));
          RvdPath p;
          try {
            p = rvd_search(from, need, whole, 4, cm, false, nullptr, blocks, -1, world);
          } catch (const NotSupported&) {
            continue;  // no path the group families can name
          }
          ++searched;
          const double start = rvd_lower_bound(from, need, whole, cm, false, blocks, world);
          EXPECT_LE(start, p.cost + 1e-12);
          if (start > 0) {
            ++lacking;
            // At least one collective, with its wait for a core.
            EXPECT_GE(start, cm.launch + cm.launch_oversub + cm.alpha_intra - 1e-15);
          }
          // Consistent along the path: what is left to pay never falls below the bound.
          double paid = 0;
          for (const Move& m : p.moves) {
            paid += m.cost;
            EXPECT_LE(rvd_lower_bound(m.after, need, whole, cm, false, blocks, world),
                      p.cost - paid + 1e-12)
                << move_name(m.kind) << "/" << m.factor;
          }
          // Each collective priced as the simulator prices it at this world.
          double collectives = 0;
          for (const Move& m : p.moves)
            if (m.kind != MoveKind::kChunk) collectives += m.cost;
          EXPECT_NEAR(collectives, simulator_price(p, from, one_rank_per_core(cm), world), 1e-12);
        }
  // Most conversions have a path, and most need a collective.
  EXPECT_GE(searched, 60);
  EXPECT_GE(lacking, 40);
}

// A plan of tp 8 on the VM's 2 cores: each tensor-parallel activation sum is one all-reduce
// over the 8 lanes, and the simulator charges for it what the search paid.
TEST(RvdWorld, ATp8PlanOnTwoCoresSumsEachActivationInOneAllReducePricedAsTheSimulatorPricesIt) {
  core::JobSpec spec = test_util::gpt_spec(2, 64, 8);
  spec.parallel.tp = 8;
  spec.parallel.dp = 1;
  spec.train.global_batch = 2;
  core::ModelGraph mg = build_planning_graph(spec);
  PlanOptions opt;
  opt.cost = vm_like();
  const Plan plan = make_plan(spec, mg.graph, 8, opt);
  ASSERT_EQ(plan.world(), 8);
  int sums = 0;
  for (int lane = 0; lane < 8; ++lane) {
    const Role& r = plan.role_of(lane);
    // No reduce-scatter anywhere (no ZeRO, no sequence parallelism: only a split would make one).
    EXPECT_TRUE(test_util::collectives(r, [](const Instr& c) {
                  return c.coll == CollKind::kReduceScatter;
                }).empty());
    for (const Instr* in : test_util::collectives(r, [](const Instr& c) {
           return c.coll == CollKind::kAllReduce && c.stage == Stage::kForward && c.part.empty();
         })) {
      const ProcessGroup& grp = plan.groups.at(size_t(plan.group_id(in->group, 0)));
      ASSERT_EQ(grp.ranks.size(), 8u);
      const double simulated =
          collective_seconds(plan, mg.graph, one_rank_per_core(opt.cost), *in, 8, false);
      // The same conversion searched alone at the plan's world costs what the simulator charges.
      const Box value = full_box({in->bytes / 4});
      GroupLayout from;
      std::vector<std::optional<Piece>> need;
      for (int m = 0; m < 8; ++m) from.push_back(Piece{value, m, 8}), need.push_back(Piece{value});
      const RvdPath p = rvd_search(from, need, value, 4, opt.cost, false, nullptr, 1, -1, 8);
      EXPECT_EQ(test_util::collectives_of(p), std::vector<std::string>{"all_reduce/8"});
      EXPECT_NEAR(p.cost, simulated, 1e-8);
      ++sums;
    }
  }
  // Two blocks, an attention and an MLP sum each, on each of 8 lanes (and a micro-batch each).
  EXPECT_GE(sums, 8 * 4);
}

}  // namespace
}  // namespace weft::planner
