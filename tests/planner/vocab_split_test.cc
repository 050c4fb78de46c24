// Vocabularies that tp does not divide (issue 12): balanced slices tile [0, vocab) exactly,
// the embedding, the tied head and the cross-entropy of one lane cut the same rows, and a
// whole plan's wte pieces (and its moments under ZeRO) cover exactly `vocab` rows.
#include <gtest/gtest.h>

#include <map>

#include "planner/partition.h"
#include "planner/planner.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {

TEST(VocabSplit, BalancedPartsTileTheRangeAndDifferByAtMostOne) {
  for (auto [V, n] : std::vector<std::pair<int64_t, int64_t>>{
           {256, 3}, {50257, 2}, {257, 2}, {256, 4}, {7, 7}, {10, 4}}) {
    DimSlice whole = DimSlice::range(0, V);
    int64_t next = 0, lo = V, hi = 0;
    for (int64_t k = 0; k < n; ++k) {
      auto p = whole.balanced_part(k, n);
      ASSERT_TRUE(p.has_value()) << V << " over " << n;
      EXPECT_EQ(p->start, next) << "part " << k << " of " << V << " over " << n;
      EXPECT_EQ(p->count, 1);
      next = p->start + p->size;
      lo = std::min(lo, p->size), hi = std::max(hi, p->size);
      if (V % n == 0) {
        EXPECT_EQ(*p, *whole.part(k, n)) << "even splits are unchanged";
      }
    }
    EXPECT_EQ(next, V) << V << " over " << n;
    EXPECT_LE(hi - lo, 1) << V << " over " << n;
  }
  EXPECT_EQ(*DimSlice::range(0, 256).balanced_part(0, 3), (DimSlice{0, 86, 1, 0}));
  EXPECT_EQ(*DimSlice::range(0, 256).balanced_part(2, 3), (DimSlice{171, 85, 1, 0}));
  EXPECT_EQ(*DimSlice::range(0, 50257).balanced_part(1, 2), (DimSlice{25129, 25128, 1, 0}));
  EXPECT_FALSE(DimSlice::range(0, 2).balanced_part(0, 3).has_value());     // an empty part
  EXPECT_FALSE((DimSlice{0, 16, 3, 64}).balanced_part(0, 2).has_value());  // strided
}

// Every op that splits the vocabulary of a V=256 model three ways cuts the same rows.
TEST(VocabSplit, EmbeddingHeadAndCrossEntropyCutTheSameRows) {
  core::JobSpec s = test_util::gpt_spec(2, 96, 6, 256);
  core::ModelGraph mg = core::build_model(s.model, 2);
  core::add_training_ops(mg, s.train);
  const core::Graph& g = mg.graph;
  for (int64_t k = 0; k < 3; ++k) {
    const DimSlice want = k == 0 ? DimSlice{0, 86, 1, 0} : DimSlice{86 + (k - 1) * 85, 85, 1, 0};
    int ops = 0;
    for (const core::Op& o : g.ops()) {
      const std::string& t = o.type;
      const bool head = t == "matmul" || t == "matmul.bwd";
      if (!head && t.rfind("embedding", 0) != 0 && t.rfind("cross_entropy", 0) != 0) continue;
      ++ops;
      SubOp p = partition_one(g, whole_op(g, o.id), head ? "n" : "v", 3, k);
      // Operands with a vocabulary dim: wte and its gradient (V,C) on dim 0, logits, probs
      // and their gradients (B,T,V) on dim 2.
      for (const std::vector<SubTensor>* side : {&p.ins, &p.outs})
        for (const SubTensor& st : *side) {
          const core::Shape& sh = g.value(st.value).shape;
          int d = sh.size() == 2 && sh[0] == 256 ? 0 : sh.size() == 3 && sh[2] == 256 ? 2 : -1;
          if (d >= 0) {
            EXPECT_EQ(st.piece.box[size_t(d)], want) << t << " " << g.value(st.value).name;
          }
        }
    }
    EXPECT_EQ(ops, 6) << "embedding, head, cross-entropy and their backwards";
  }
}

// The distinct boxes of `name` held by the plan's ranks (persistent, not views) must tile
// the value exactly: every element in one box, none outside, no two boxes overlapping.
void expect_exact_cover(const Plan& plan, const core::Graph& g, const std::string& name) {
  const int value = g.find_value(name);
  ASSERT_GE(value, 0) << name;
  const core::Shape& shape = g.value(value).shape;
  ASSERT_EQ(shape.size(), 2u);
  std::map<std::string, Box> boxes;
  for (int r = 0; r < plan.world(); ++r)
    for (const TensorDesc& t : plan.program(r).tensors)
      if (t.value == value && t.persistent && t.alias_of < 0) {
        EXPECT_FALSE(t.piece.partial()) << name;
        boxes[box_str(t.piece.box)] = t.piece.box;
      }
  std::vector<int> hits(size_t(shape[0] * shape[1]), 0);
  for (const auto& [key, b] : boxes)
    for (int64_t c0 = 0; c0 < b[0].count; ++c0)
      for (int64_t i = 0; i < b[0].size; ++i)
        for (int64_t c1 = 0; c1 < b[1].count; ++c1)
          for (int64_t j = 0; j < b[1].size; ++j) {
            int64_t row = b[0].start + c0 * b[0].stride + i,
                    col = b[1].start + c1 * b[1].stride + j;
            ASSERT_LT(row, shape[0]) << name << " " << key;
            ASSERT_LT(col, shape[1]) << name << " " << key;
            ++hits[size_t(row * shape[1] + col)];
          }
  int64_t bad = 0;
  for (int h : hits) bad += h != 1;
  EXPECT_EQ(bad, 0) << name << ": elements not held by exactly one distinct box (" << boxes.size()
                    << " boxes)";
}

TEST(VocabSplit, PlansHoldExactlyVocabRows) {
  struct Case {
    int64_t dim, heads, vocab, tp, pp, dp;
    int zero, world;
  };
  for (Case c : {Case{96, 6, 256, 3, 1, 1, 0, 3}, Case{64, 4, 50257, 2, 1, 2, 1, 4},
                 Case{64, 4, 257, 2, 2, 1, 0, 4}, Case{64, 4, 257, 2, 1, 2, 3, 4}}) {
    SCOPED_TRACE("vocab " + std::to_string(c.vocab) + " tp " + std::to_string(c.tp) + " pp " +
                 std::to_string(c.pp) + " dp " + std::to_string(c.dp) + " zero " +
                 std::to_string(c.zero));
    core::JobSpec s = test_util::gpt_spec(2, c.dim, c.heads, c.vocab);
    s.parallel.tp = c.tp, s.parallel.pp = c.pp, s.parallel.dp = c.dp, s.parallel.zero = c.zero;
    core::ModelGraph pg = build_planning_graph(s);
    Plan plan = make_plan(s, pg.graph, c.world);
    for (const char* name : {"wte.weight", "adam_m:wte.weight", "adam_v:wte.weight"})
      expect_exact_cover(plan, pg.graph, name);
    if (c.zero == 0) {
      // One slice per tp lane, sizes differing by one where tp does not divide the vocab.
      std::map<int64_t, int64_t> rows;
      for (int r = 0; r < plan.world(); ++r)
        for (const TensorDesc& t : plan.program(r).tensors)
          if (t.value == pg.graph.find_value("wte.weight") && t.persistent && t.alias_of < 0)
            rows[t.piece.box[0].start] = t.piece.box[0].size;
      EXPECT_EQ(int64_t(rows.size()), c.tp);
      int64_t lo = c.vocab, hi = 0;
      for (auto [start, size] : rows) lo = std::min(lo, size), hi = std::max(hi, size);
      EXPECT_EQ(hi - lo, c.vocab % c.tp ? 1 : 0);
    }
  }
}

}  // namespace
}  // namespace weft::planner
