// Closed forms: Megatron TP's two all-reduces per layer and direction, one gradient
// reduction per parameter and step, ZeRO-1's bytes equal to DP's, EP's all-to-all volumes
// equal to the routed tokens, tied weights reduced across stages, every gradient element
// counted once in the global norm, and per-rank materialisation of role programs.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "planner/validate.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {
using test_util::gpt_spec;

struct Planned {
  core::ModelGraph mg;
  Plan plan;
  Planned(const core::JobSpec& s, int world) : mg(build_planning_graph(s)), plan(make_plan(s, mg.graph, world)) {
    ValidationReport v = validate_plan(plan, mg.graph);
    for (const std::string& e : v.errors) ADD_FAILURE() << e;
  }
  int group_size(const Instr& in, int dp = 0) const {
    return int(plan.groups.at(size_t(plan.group_id(in.group, dp))).ranks.size());
  }
};

int64_t param_elements(const core::Graph& g) {
  int64_t n = 0;
  for (int p : g.parameters()) n += core::shape_numel(g.value(p).shape);
  return n;
}

TEST(ClosedForm, MegatronTpTwoAllReducesPerLayerEachWay) {
  for (int64_t tp : {2, 4}) {
    core::JobSpec s = gpt_spec(3, 64, 4, 256, 16);
    s.parallel.tp = tp;
    Planned p(s, int(tp));
    const int64_t b = s.train.micro_batch, t = s.model.seq_len, h = s.model.dim;
    for (const Role& r : p.plan.roles) {
      std::map<std::pair<int, int>, int> count;  // (layer, forward?) -> all-reduces
      for (const Instr& in : r.program) {
        if (in.kind != InstrKind::kCollective || in.mb != 0 || !in.part.empty()) continue;
        int layer = p.mg.graph.op(in.op).layer;
        if (layer < 0) continue;
        EXPECT_EQ(in.coll, CollKind::kAllReduce);
        EXPECT_EQ(in.bytes, b * t * h * 4) << "each all-reduce moves b*s*h elements";
        EXPECT_EQ(p.group_size(in), tp);
        ++count[{layer, in.stage == Stage::kForward}];
      }
      for (int layer = 0; layer < 3; ++layer) {
        EXPECT_EQ((count[{layer, true}]), 2) << "tp " << tp << " layer " << layer << " forward";
        EXPECT_EQ((count[{layer, false}]), 2) << "tp " << tp << " layer " << layer << " backward";
      }
    }
  }
}

TEST(ClosedForm, DataParallelReducesEachGradientOncePerStep) {
  core::JobSpec s = gpt_spec(2);
  s.parallel.pp = 2;
  Planned p(s, 8);  // dp 4 x pp 2
  const core::Graph& g = p.mg.graph;
  for (int rank = 0; rank < p.plan.world(); ++rank) {
    const Role& r = p.plan.role_of(rank);
    std::map<int, int> syncs;  // parameter -> reductions of its gradient
    for (const Instr& in : r.program) {
      if (in.kind != InstrKind::kCollective || (in.part != "grad.sync" && in.part != "grad.tied")) continue;
      EXPECT_EQ(in.coll, CollKind::kAllReduce);
      // The tied embedding's two copies (first and last stage) are summed with the four
      // replicas' addends in one all-reduce over both stages; the phase-3 search found
      // that cheaper than the four-way reduction followed by a two-way one.
      EXPECT_EQ(p.group_size(in), in.part == "grad.tied" ? 8 : 4);
      int64_t bucket = 0;  // gradients travel in buckets: one grouped call, several tensors
      for (const Operand& o : in.in) {
        const TensorDesc& t = r.tensors[size_t(o.tensor)];
        int param = g.value(t.value).grad_of;
        EXPECT_EQ(in.part == "grad.tied", g.value(param).name == "wte.weight");
        EXPECT_EQ(t.bytes, core::shape_numel(g.value(param).shape) * 4);
        bucket += t.bytes;
        ++syncs[param];
      }
      EXPECT_EQ(in.bytes, bucket);
    }
    for (auto [param, n] : syncs) EXPECT_EQ(n, 1) << g.value(param).name;
    // Every parameter the stage computes with is reduced.
    std::set<int> used;
    for (const Instr& in : r.program)
      if (in.kind == InstrKind::kCompute && in.stage == Stage::kStep && g.op(in.op).type == "adamw")
        used.insert(g.op(in.op).inputs[0]);
    EXPECT_EQ(used.size(), syncs.size());
  }
  int tied = 0;
  for (const Role& r : p.plan.roles)
    for (const Instr& in : r.program) tied += in.kind == InstrKind::kCollective && in.part == "grad.tied";
  EXPECT_EQ(tied, 2);  // one per stage holding a copy
}

int64_t sync_wire_bytes(const Planned& p) {
  int64_t total = 0;
  for (int rank = 0; rank < p.plan.world(); ++rank)
    for (const Instr& in : p.plan.role_of(rank).program)
      if (in.kind == InstrKind::kCollective &&
          (in.part == "grad.sync" || in.part == "param.gather" || in.part == "grad.tied"))
        // Buffer bytes per ring pass: all-reduce is a reduce-scatter plus an all-gather.
        total += in.coll == CollKind::kAllReduce ? 2 * in.bytes : in.bytes;
  return total;
}

TEST(ClosedForm, ZeroOneMovesTheSameBytesAsDataParallel) {
  core::JobSpec s = gpt_spec(2);
  s.parallel.tp = 2;
  Planned dp(s, 8);
  s.parallel.zero = 1;
  Planned z1(s, 8);
  EXPECT_EQ(sync_wire_bytes(z1), sync_wire_bytes(dp));
  int rs = 0, ag = 0;
  for (const Instr& in : z1.plan.roles[0].program) {
    if (in.kind != InstrKind::kCollective) continue;
    rs += in.part == "grad.sync" && in.coll == CollKind::kReduceScatter;
    ag += in.part == "param.gather" && in.coll == CollKind::kAllGather;
  }
  EXPECT_GT(rs, 0);
  EXPECT_EQ(rs, ag);
  // Sharded optimizer state: less persistent memory per rank.
  EXPECT_LT(z1.plan.costs.ranks[0].persistent_bytes, dp.plan.costs.ranks[0].persistent_bytes);
  // ZeRO-3 shards the parameters too and gathers them per use.
  s.parallel.zero = 3;
  Planned z3(s, 8);
  EXPECT_LT(z3.plan.costs.ranks[0].persistent_bytes, z1.plan.costs.ranks[0].persistent_bytes);
  int gathers = 0;
  for (const Instr& in : z3.plan.roles[0].program) gathers += in.part == "zero3.gather";
  EXPECT_GT(gathers, 0);
}

TEST(ClosedForm, ExpertParallelAllToAllVolumesEqualRoutedTokens) {
  core::JobSpec s = test_util::moe_spec(4, 2);
  s.parallel.ep = 2;
  Planned p(s, 4);  // ep 2 x dp 2
  const int64_t tokens = s.train.micro_batch * s.model.seq_len, k = s.model.moe.top_k, C = s.model.dim;
  for (const Role& r : p.plan.roles) {
    std::map<std::pair<int, int>, int> per_layer;  // (layer, forward?) -> all_to_all_v
    for (const Instr& in : r.program) {
      if (in.kind != InstrKind::kCollective || in.coll != CollKind::kAllToAllV || in.mb != 0) continue;
      EXPECT_TRUE(in.data_dependent);
      EXPECT_EQ(in.bytes, tokens * k * C * 4) << "routed assignments x channels";
      EXPECT_EQ(p.group_size(in), 2);
      ++per_layer[{p.mg.graph.op(in.op).layer, in.stage == Stage::kForward}];
    }
    for (int layer = 0; layer < 2; ++layer) {
      EXPECT_EQ((per_layer[{layer, true}]), 2);   // dispatch and return
      EXPECT_EQ((per_layer[{layer, false}]), 2);
    }
  }
}

TEST(ClosedForm, GlobalNormCountsEveryGradientElementOnce) {
  for (int zero : {0, 1}) {
    core::JobSpec s = gpt_spec(2);
    s.parallel.tp = 2;
    s.parallel.pp = 2;
    s.parallel.zero = zero;
    Planned p(s, 8);
    const core::Graph& g = p.mg.graph;
    int64_t counted = 0;
    for (int rank = 0; rank < p.plan.world(); ++rank) {
      const Role& r = p.plan.role_of(rank);
      int dp = p.plan.mesh.coord(rank).dp;
      int seen = 0;
      for (const Instr& in : r.program) {
        if (in.part != "norm.sumsq") continue;
        // With ZeRO the first sum covers shards (all ranks), the second whole gradients
        // (one data-parallel replica); without ZeRO there is only the second.
        bool sharded = zero >= 1 && seen++ == 0;
        if (!sharded && dp != 0) continue;
        for (const Operand& o : in.in) counted += r.tensors[size_t(o.tensor)].piece.numel();
      }
    }
    EXPECT_EQ(counted, param_elements(g)) << "zero " << zero;
  }
}

TEST(RankPrograms, ReplicasShiftTheirBatchRowsAndResolveGroups) {
  core::JobSpec s = gpt_spec(2);
  s.parallel.tp = 2;
  Planned p(s, 4);  // tp 2 x dp 2
  const int64_t rows = s.train.micro_batch * p.plan.config.micro_batches;
  for (int rank = 0; rank < 4; ++rank) {
    RankProgram rp = p.plan.program(rank);
    EXPECT_EQ(rp.coord, p.plan.mesh.coord(rank));
    const Instr* load = nullptr;
    for (const Instr& in : rp.program)
      if (in.kind == InstrKind::kLoad && !load) load = &in;
    ASSERT_NE(load, nullptr);
    EXPECT_EQ(rp.tensors[size_t(load->out[0].tensor)].piece.box[0].start, rp.coord.dp * rows);
    for (const Instr& in : rp.program)
      if (in.kind == InstrKind::kCollective) {
        const auto& ranks = p.plan.groups.at(size_t(in.group)).ranks;
        EXPECT_NE(std::find(ranks.begin(), ranks.end(), rank), ranks.end());
      }
  }
}

}  // namespace
}  // namespace weft::planner
