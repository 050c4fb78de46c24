// Phase 1: box arithmetic and op partitioning by annotation and by the custom rules.
#include <gtest/gtest.h>

#include "base/error.h"
#include "planner/partition.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {

// A GPT graph with B=4, T=16, C=64, H=4, V=256 (not the planning graph: any batch works).
struct Gpt {
  core::ModelGraph mg;
  explicit Gpt(const core::JobSpec& s = test_util::gpt_spec()) : mg(core::build_model(s.model, 4)) {
    core::add_training_ops(mg, s.train);
  }
  const core::Graph& g() const { return mg.graph; }
  int op(const std::string& type, const std::string& scope) const {
    for (const core::Op& o : g().ops())
      if (o.type == type && o.scope == scope) return o.id;
    ADD_FAILURE() << "no op " << type << " in " << scope;
    return -1;
  }
};

TEST(DimSlice, StridedPartsMergeAndContain) {
  DimSlice whole{0, 192, 1, 0};
  auto p1 = whole.part(1, 4, 3);  // (3 h d) with h split 4 ways: 3 chunks of 16, stride 64
  ASSERT_TRUE(p1.has_value());
  EXPECT_EQ(*p1, (DimSlice{16, 16, 3, 64}));
  EXPECT_TRUE(whole.contains(*p1));
  auto p0 = whole.part(0, 4, 3);
  auto merged = p0->merged(*p1);
  ASSERT_TRUE(merged.has_value());
  EXPECT_EQ(*merged, (DimSlice{0, 32, 3, 64}));
  EXPECT_FALSE(p1->merged(*p0).has_value());  // not in chunk order
  // Four parts merged give back the plain range.
  DimSlice all = *whole.part(0, 4, 3);
  for (int k = 1; k < 4; ++k) all = *all.merged(*whole.part(k, 4, 3));
  EXPECT_EQ(all, whole);
  EXPECT_FALSE(DimSlice::range(0, 10).part(0, 3).has_value());
  EXPECT_FALSE(p1->contains(DimSlice{0, 16, 1, 0}));
}

TEST(Partition, ColumnSplitOfLinearCutsOutputsAndWeights) {
  Gpt m;
  int fc = m.op("linear", "h.0.mlp");
  SubOp s = partition_one(m.g(), whole_op(m.g(), fc), "n", 4, 1);
  EXPECT_EQ(s.ins[0].piece.box[2], (DimSlice{0, 64, 1, 0}));   // x replicated
  EXPECT_EQ(s.ins[1].piece.box[0], (DimSlice{64, 64, 1, 0}));  // weight rows 64..128 of 256
  EXPECT_EQ(s.ins[2].piece.box[0], (DimSlice{64, 64, 1, 0}));  // bias
  EXPECT_EQ(s.outs[0].piece.box[2], (DimSlice{64, 64, 1, 0}));
  EXPECT_FALSE(s.outs[0].piece.partial());
}

TEST(Partition, RowSplitLeavesPartialSumsAndAddsBiasOnce) {
  Gpt m;
  int proj = m.op("linear", "h.0.mlp");
  for (const core::Op& o : m.g().ops())
    if (o.type == "linear" && o.scope == "h.0.mlp" && o.id != proj) proj = o.id;  // the second: proj
  SubOp p0 = partition_one(m.g(), whole_op(m.g(), proj), "k", 2, 0);
  SubOp p1 = partition_one(m.g(), whole_op(m.g(), proj), "k", 2, 1);
  EXPECT_EQ(p1.outs[0].piece.part, 1);
  EXPECT_EQ(p1.outs[0].piece.parts, 2);
  EXPECT_FALSE(p0.ins[2].dropped);
  EXPECT_TRUE(p1.ins[2].dropped);
  // Its backward: the bias gradient is whole on every part, the input gradient is cut.
  int bwd = -1;
  for (const core::Op& o : m.g().ops())
    if (o.mirror == proj) bwd = o.id;
  SubOp b = partition_one(m.g(), whole_op(m.g(), bwd), "k", 2, 1);
  EXPECT_FALSE(b.outs[2].piece.partial());
  EXPECT_EQ(b.outs[0].piece.box[2], (DimSlice{128, 128, 1, 0}));
  EXPECT_EQ(b.outs[1].piece.box[1], (DimSlice{128, 128, 1, 0}));
}

TEST(Partition, FrozenAndAbsentDimsAreRefused) {
  Gpt m;
  int ln = m.op("layernorm", "h.0");
  EXPECT_THROW(partition_one(m.g(), whole_op(m.g(), ln), "c", 2, 0), NotSupported);
  EXPECT_THROW(partition_one(m.g(), whole_op(m.g(), ln), "zz", 2, 0), NotSupported);
  int att = m.op("attention", "h.0.attn");
  EXPECT_THROW(partition_one(m.g(), whole_op(m.g(), att), "t", 2, 0), NotSupported);  // t^: causal
}

TEST(Partition, AttentionByHeadsTakesThreeStridedChunks) {
  Gpt m;
  int att = m.op("attention", "h.0.attn");
  SubOp s = partition_one(m.g(), whole_op(m.g(), att), "h", 4, 2);
  // qkv (B,T,192): q, k, v blocks of 64; head group 2 of 4 = columns 32..48 of each block.
  EXPECT_EQ(s.ins[0].piece.box[2], (DimSlice{32, 16, 3, 64}));
  EXPECT_EQ(s.outs[0].piece.box[2], (DimSlice{32, 16, 1, 0}));
  EXPECT_EQ(s.outs[1].piece.box[1], (DimSlice{2, 1, 1, 0}));
  // The qkv projection split with 3 groups produces exactly that piece.
  int qkv = m.op("linear", "h.0.attn");
  SubOp l = partition_one(m.g(), whole_op(m.g(), qkv), "n", 4, 2, 3);
  EXPECT_EQ(l.outs[0].piece.box[2], s.ins[0].piece.box[2]);
  EXPECT_EQ(l.ins[1].piece.box[0], (DimSlice{32, 16, 3, 64}));
}

TEST(Partition, VocabParallelEmbeddingAndCrossEntropy) {
  Gpt m;
  int emb = m.op("embedding", "embed");
  SubOp e1 = partition_one(m.g(), whole_op(m.g(), emb), "v", 2, 1);
  EXPECT_EQ(e1.ins[1].piece.box[0], (DimSlice{128, 128, 1, 0}));
  EXPECT_TRUE(e1.ins[2].dropped);  // position table added by part 0 only
  EXPECT_TRUE(e1.outs[0].piece.partial());
  int ebwd = -1;
  for (const core::Op& o : m.g().ops())
    if (o.mirror == emb) ebwd = o.id;
  SubOp eb = partition_one(m.g(), whole_op(m.g(), ebwd), "v", 2, 1);
  EXPECT_EQ(eb.outs[0].piece.box[0], (DimSlice{128, 128, 1, 0}));
  EXPECT_FALSE(eb.outs[1].piece.partial());

  int ce = m.op("cross_entropy", "head");
  SubOp c = partition_one(m.g(), whole_op(m.g(), ce), "v", 4, 3);
  EXPECT_TRUE(c.vocab_parallel);
  EXPECT_EQ(c.ins[0].piece.box[2], (DimSlice{192, 64, 1, 0}));
  EXPECT_FALSE(c.outs[0].piece.partial());  // the loss is whole after the all-reduces
  EXPECT_EQ(c.outs[1].piece.box[2], (DimSlice{192, 64, 1, 0}));
}

TEST(Partition, MoeByExpertsAndBatchAliases) {
  core::JobSpec s = test_util::moe_spec(4, 2);
  Gpt m(s);
  int moe = m.op("moe", "h.0.moe");
  SubOp e = partition_one(m.g(), whole_op(m.g(), moe), "e", 2, 1);
  EXPECT_TRUE(e.expert_parallel);
  EXPECT_EQ(e.expert_index, 1);
  for (int i = 2; i < 6; ++i) EXPECT_EQ(e.ins[size_t(i)].piece.box[0], (DimSlice{2, 2, 1, 0}));
  EXPECT_FALSE(e.outs[0].piece.partial());
  // The batch split cuts n = (b t) and a = (b t k) rows proportionally.
  SubOp b = partition_one(m.g(), whole_op(m.g(), moe), "b", 4, 1);
  EXPECT_EQ(b.ins[0].piece.box[0], (DimSlice{1, 1, 1, 0}));
  EXPECT_EQ(b.outs[2].piece.box[0], (DimSlice{16, 16, 1, 0}));   // probs: 16 tokens per sample
  EXPECT_EQ(b.outs[3].piece.box[0], (DimSlice{32, 32, 1, 0}));   // route: 32 assignments
  EXPECT_TRUE(b.outs[1].piece.partial());                        // aux loss: a partial sum
  EXPECT_EQ(b.ins[0].batch_dim, 0);
  // Hidden units split: router state whole, expert outputs partial, output bias once.
  SubOp f = partition_one(m.g(), whole_op(m.g(), moe), "f", 2, 1);
  EXPECT_TRUE(f.outs[0].piece.partial());
  EXPECT_FALSE(f.outs[2].piece.partial());
  EXPECT_TRUE(f.ins[5].dropped);
}

TEST(Partition, MicroBatchingIsABatchSplitAndReplicateCopies) {
  Gpt m;
  int emb = m.op("embedding", "embed");
  std::vector<SubOp> parts = partition(m.g(), whole_op(m.g(), emb), "b", 4);
  ASSERT_EQ(parts.size(), 4u);
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(parts[size_t(k)].ins[0].piece.box[0], (DimSlice{k, 1, 1, 0}));
    EXPECT_EQ(parts[size_t(k)].outs[0].piece.box[0], (DimSlice{k, 1, 1, 0}));
    EXPECT_EQ(parts[size_t(k)].ins[1].piece.box, full_box({256, 64}));  // weights whole
  }
  std::vector<SubOp> reps = replicate(parts[0], 3);
  ASSERT_EQ(reps.size(), 3u);
  EXPECT_EQ(reps[2].outs[0].piece, parts[0].outs[0].piece);
  // The loss of a micro-batch is one partial sum of the step's loss.
  int ce = m.op("cross_entropy", "head");
  SubOp c = partition_one(m.g(), whole_op(m.g(), ce), "b", 4, 3);
  EXPECT_EQ(c.outs[0].piece.part, 3);
  EXPECT_EQ(c.outs[0].piece.parts, 4);
}

TEST(Partition, BackwardOpsShareTheirForwardSymbols) {
  Gpt m;
  // Every backward op accepts its forward op's tensor-parallel split symbol.
  const std::map<std::string, std::string> sym = {{"linear", "n"}, {"attention", "h"}, {"gelu", "n"},
                                                  {"embedding", "v"}, {"matmul", "n"}};
  int checked = 0;
  for (const core::Op& o : m.g().ops()) {
    if (o.phase != core::Phase::kBackward) continue;
    auto it = sym.find(m.g().op(o.mirror).type);
    if (it == sym.end()) continue;
    SCOPED_TRACE(o.type);
    SubOp f = partition_one(m.g(), whole_op(m.g(), o.mirror), it->second, 2, 1);
    SubOp b = partition_one(m.g(), whole_op(m.g(), o.id), it->second, 2, 1);
    // The gradient of each forward input has the input's piece.
    for (size_t j = 0; j < b.outs.size(); ++j) {
      int fwd_value = m.g().value(o.outputs[j]).grad_of;
      for (size_t i = 0; i < f.ins.size(); ++i) {
        if (f.ins[i].value == fwd_value && !f.ins[i].piece.partial() && !b.outs[j].piece.partial()) {
          EXPECT_EQ(b.outs[j].piece.box, f.ins[i].piece.box) << m.g().value(fwd_value).name;
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 10);
}

}  // namespace
}  // namespace weft::planner
