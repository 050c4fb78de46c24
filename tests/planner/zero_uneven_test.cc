// ZeRO over holders that divide no dim of a parameter (dp 3 on widths 32, 128 and 256): every
// parameter is still sharded, torch.chunk's way (ceil(n / 3) rows, the last holder's shorter),
// so the shards of every rank together hold each element of the state exactly once and each
// rank about a third of it. Also where the holders are the ep lanes of one replica (dp 1, the
// last lane's role holds the short shard) and where a parameter's only dim is strided (a tp
// lane's qkv bias over dp 3: one of its q, k, v chunks each).
#include <gtest/gtest.h>

#include <map>

#include "planner/plan_json.h"
#include "planner/validate.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {

TEST(PaddedPart, CutsAsTorchChunkDoes) {
  const DimSlice r = DimSlice::range(0, 64);
  EXPECT_EQ(*r.padded_part(0, 3), (DimSlice{0, 22, 1, 0}));
  EXPECT_EQ(*r.padded_part(1, 3), (DimSlice{22, 22, 1, 0}));
  EXPECT_EQ(*r.padded_part(2, 3), (DimSlice{44, 20, 1, 0}));
  EXPECT_EQ(*DimSlice::range(10, 42).padded_part(2, 3), (DimSlice{32, 10, 1, 0}));  // 11, 11, 10
  for (int64_t n : {1, 2, 4, 8})  // equal to part() where n divides
    for (int64_t k = 0; k < n; ++k) EXPECT_EQ(*r.padded_part(k, n), *r.part(k, n));
  EXPECT_FALSE(DimSlice::range(0, 4).padded_part(0, 3).has_value());     // 2, 2, 0: an empty part
  EXPECT_FALSE((DimSlice{0, 16, 3, 64}).padded_part(0, 2).has_value());  // strided
  EXPECT_FALSE(r.padded_part(3, 3).has_value());
}

struct Planned {
  core::ModelGraph mg;
  Plan plan;
  Planned(const core::JobSpec& s, int world)
      : mg(build_planning_graph(s)), plan(make_plan(s, mg.graph, world)) {
    ValidationReport v = validate_plan(plan, mg.graph);
    for (const std::string& e : v.errors) ADD_FAILURE() << e;
  }
};

// dim 32 and the MLP's 128 are not multiples of 3 and neither is the vocabulary (256); the
// qkv rows (96) are.
core::JobSpec uneven_spec(int zero) {
  core::JobSpec s = test_util::gpt_spec(2, 32, 4, 256, 16);
  s.train.global_batch = 12;
  s.parallel.dp = 3;
  s.parallel.zero = zero;
  return s;
}

// Elements of every persistent tensor of `role` (parameters, gradient accumulators, moments)
// per graph value, on each rank's materialised program.
using PerValue = std::map<int, int64_t>;
std::vector<PerValue> held(const Planned& p, core::Role role) {
  std::vector<PerValue> out;
  for (int rank = 0; rank < p.plan.world(); ++rank) {
    PerValue v;
    for (const TensorDesc& t : p.plan.program(rank).tensors) {
      if (!t.persistent || t.alias_of >= 0 || t.value < 0 || p.mg.graph.value(t.value).role != role)
        continue;
      EXPECT_EQ(t.bytes, t.piece.numel() * 4) << t.name << " on rank " << rank;
      v[t.value] += t.piece.numel();
    }
    out.push_back(v);
  }
  return out;
}

// Each value of `role` is split across the three ranks: together they hold it once, none
// whole, and each rank about a third: ceil(n / 3) rows on ranks 0 and 1, the rest on rank 2
// (measured 0.3385, 0.3385, 0.3230 of the state; the ln vectors' 11, 11, 10 of 32 are the
// most uneven part).
void expect_one_copy_in_thirds(const Planned& p, core::Role role, const char* what) {
  std::vector<PerValue> ranks = held(p, role);
  ASSERT_EQ(ranks.size(), 3u);
  int64_t whole = 0;
  for (const auto& [value, n] : ranks[0]) {
    const int64_t full = core::shape_numel(p.mg.graph.value(value).shape);
    int64_t sum = 0;
    for (const PerValue& r : ranks) {
      const int64_t mine = r.count(value) ? r.at(value) : 0;
      EXPECT_LT(mine, full) << what << " " << p.mg.graph.value(value).name << " stays whole";
      sum += mine;
    }
    EXPECT_EQ(sum, full) << what << " " << p.mg.graph.value(value).name;
    whole += full;
  }
  ASSERT_GT(whole, 0) << what;
  for (size_t r = 0; r < ranks.size(); ++r) {
    int64_t mine = 0;
    for (const auto& [value, n] : ranks[r]) mine += n;
    const double share = double(mine) / double(whole);
    EXPECT_NEAR(share, 1.0 / 3, 0.011)
        << what << " on rank " << r << ": " << mine << " of " << whole;
  }
}

TEST(ZeroUneven, Dp3Zero1ShardsEveryMomentOnce) {
  Planned p(uneven_spec(1), 3);
  expect_one_copy_in_thirds(p, core::Role::kOptimizerState, "moments");
}

TEST(ZeroUneven, Dp3Zero2ShardsMomentsAndGradientsOnce) {
  Planned p(uneven_spec(2), 3);
  expect_one_copy_in_thirds(p, core::Role::kOptimizerState, "moments");
  expect_one_copy_in_thirds(p, core::Role::kGradient, "gradients");
}

TEST(ZeroUneven, Dp3Zero3ShardsParametersMomentsAndGradientsOnce) {
  Planned p(uneven_spec(3), 3);
  expect_one_copy_in_thirds(p, core::Role::kParameter, "parameters");
  expect_one_copy_in_thirds(p, core::Role::kOptimizerState, "moments");
  expect_one_copy_in_thirds(p, core::Role::kGradient, "gradients");
  // The plan's own memory estimate (replica 0's shards, the largest) drops to about a
  // third of ZeRO-0's persistent state.
  Planned z0(uneven_spec(0), 3);
  const double ratio = double(p.plan.costs.ranks[0].persistent_bytes) /
                       double(z0.plan.costs.ranks[0].persistent_bytes);
  EXPECT_LT(ratio, 0.36) << p.plan.costs.ranks[0].persistent_bytes << " vs "
                         << z0.plan.costs.ranks[0].persistent_bytes;
}

// The uneven gather and scatter move each member's own rows: the all-gather of ZeRO-3's
// wte shards (86, 86, 84 rows of 32) lands as the whole 256 x 32 parameter.
TEST(ZeroUneven, LastShardIsCutAndTheCutSurvivesJson) {
  Planned p(uneven_spec(3), 3);
  const int wte = p.mg.graph.find_value("wte.weight");
  ASSERT_GE(wte, 0);
  std::vector<int64_t> rows;
  for (int rank = 0; rank < 3; ++rank)
    for (const TensorDesc& t : p.plan.program(rank).tensors)
      if (t.value == wte && t.persistent && t.alias_of < 0) {
        EXPECT_EQ(t.piece.box[0].start, 86 * rank);
        rows.push_back(t.piece.box[0].size);
      }
  EXPECT_EQ(rows, (std::vector<int64_t>{86, 86, 84}));
  Plan q = plan_from_json(plan_to_json(p.plan));
  for (int rank = 0; rank < 3; ++rank)
    EXPECT_EQ(q.program(rank).tensors, p.plan.program(rank).tensors);
}

// dp 1, ep 3: a dense parameter's holders are the three ep lanes of the one data-parallel
// replica, so the short shard (wte's last 84 rows, the ln vectors' last 20 of 64) is held by
// lane 2's role itself, not by a shifted replica; the experts are split by ep already.
core::JobSpec ep3_spec(int zero) {
  core::JobSpec s = test_util::moe_spec(3, 2);
  s.model.seq_len = 12;  // ep 3 divides each lane's 2 x 12 x top-2 routed rows
  s.train.global_batch = 12;
  s.parallel.dp = 1;
  s.parallel.ep = 3;
  s.parallel.zero = zero;
  return s;
}

TEST(ZeroUneven, Dp1Ep3ShardsEveryParameterMomentAndGradientOnce) {
  Planned p(ep3_spec(3), 3);
  expect_one_copy_in_thirds(p, core::Role::kParameter, "parameters");
  expect_one_copy_in_thirds(p, core::Role::kOptimizerState, "moments");
  expect_one_copy_in_thirds(p, core::Role::kGradient, "gradients");
  const int wte = p.mg.graph.find_value("wte.weight");
  ASSERT_GE(wte, 0);
  std::vector<int64_t> rows;
  for (int rank = 0; rank < 3; ++rank)
    for (const TensorDesc& t : p.plan.program(rank).tensors)
      if (t.value == wte && t.persistent && t.alias_of < 0) rows.push_back(t.piece.box[0].size);
  EXPECT_EQ(rows, (std::vector<int64_t>{86, 86, 84}));
  Plan q = plan_from_json(plan_to_json(p.plan));
  for (int rank = 0; rank < 3; ++rank)
    EXPECT_EQ(q.program(rank).tensors, p.plan.program(rank).tensors);
}

TEST(ZeroUneven, Dp1Ep3Zero1ShardsEveryMomentOnce) {
  Planned p(ep3_spec(1), 3);
  expect_one_copy_in_thirds(p, core::Role::kOptimizerState, "moments");
}

// dp 3, tp 2: a tp lane's qkv bias is 3 chunks of 16 (its heads' q, k and v rows), a strided
// dim that 3 divides in neither way 1/3 of each chunk would need; each dp rank holds one
// whole chunk, so the six ranks hold the 96 values once (before: each held its lane's 48).
TEST(ZeroUneven, Dp3Tp2ShardsTheQkvBiasByWholeChunks) {
  core::JobSpec s = uneven_spec(3);
  s.parallel.tp = 2;
  Planned p(s, 6);
  for (const char* name : {"h.0.attn.qkv.bias", "grad:h.0.attn.qkv.bias",
                           "adam_m:h.0.attn.qkv.bias", "adam_v:h.0.attn.qkv.bias"}) {
    const int value = p.mg.graph.find_value(name);
    ASSERT_GE(value, 0) << name;
    std::map<int64_t, int> copies;  // row -> ranks holding it
    for (int rank = 0; rank < 6; ++rank)
      for (const TensorDesc& t : p.plan.program(rank).tensors) {
        if (t.value != value || !t.persistent || t.alias_of >= 0) continue;
        const DimSlice& d = t.piece.box[0];
        EXPECT_EQ(d.numel(), 16) << name << " on rank " << rank << ": " << box_str(t.piece.box);
        for (int64_t c = 0; c < d.count; ++c)
          for (int64_t i = 0; i < d.size; ++i) ++copies[d.start + c * d.stride + i];
      }
    EXPECT_EQ(copies.size(), 96u) << name;
    for (const auto& [row, n] : copies) EXPECT_EQ(n, 1) << name << " row " << row;
  }
}

}  // namespace
}  // namespace weft::planner
