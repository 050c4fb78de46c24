// The Llama block under the planner: grouped-query attention splits by KV-head groups, the
// tensor-parallel propagation gives Megatron's pairs (q, k, v, gate, up by columns; o and
// down by rows), every backward op takes its forward op's split, and tp must divide the KV
// heads; the closed-form memory estimate counts the Llama parameters the builder makes.
#include <gtest/gtest.h>

#include <map>

#include "planner/memory_estimate.h"
#include "planner/partition.h"
#include "planner/policy.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {

// dim 64, 8 query heads of 8 sharing 2 KV heads, SwiGLU 176, vocab 256.
core::JobSpec llama_spec() {
  core::JobSpec s = test_util::gpt_spec(2, 64, 8);
  s.model.arch = "llama";
  s.model.kv_heads = 2;
  return s;
}

struct Llama {
  core::ModelGraph mg;
  explicit Llama(const core::JobSpec& s = llama_spec()) : mg(core::build_model(s.model, 4)) {
    core::add_training_ops(mg, s.train);
  }
  const core::Graph& g() const { return mg.graph; }
  int op(const std::string& type, const std::string& out_name) const {
    for (const core::Op& o : g().ops())
      if (o.type == type && g().value(o.outputs[0]).name == out_name) return o.id;
    ADD_FAILURE() << "no op " << type << " writing " << out_name;
    return -1;
  }
};

TEST(LlamaPartition, AttentionSplitsByKvHeadGroups) {
  Llama m;
  int att = m.op("gqa_attention", "model.layers.0.self_attn.out");
  SubOp s = partition_one(m.g(), whole_op(m.g(), att), "g", 2, 1);
  // KV head 1 of 2 serves query heads 4..7: q columns 32..64, k and v columns 8..16.
  EXPECT_EQ(s.ins[0].piece.box[2], (DimSlice{32, 32, 1, 0}));
  EXPECT_EQ(s.ins[1].piece.box[2], (DimSlice{8, 8, 1, 0}));
  EXPECT_EQ(s.ins[2].piece.box[2], (DimSlice{8, 8, 1, 0}));
  EXPECT_EQ(s.outs[0].piece.box[2], (DimSlice{32, 32, 1, 0}));
  EXPECT_EQ(s.outs[1].piece.box[1], (DimSlice{4, 4, 1, 0}));
  // The rotary embedding of q and of k, split by their heads, produce exactly those pieces.
  SubOp rq = partition_one(m.g(), whole_op(m.g(), m.op("rope", "model.layers.0.self_attn.q_rot")), "h", 2, 1);
  SubOp rk = partition_one(m.g(), whole_op(m.g(), m.op("rope", "model.layers.0.self_attn.k_rot")), "h", 2, 1);
  EXPECT_EQ(rq.outs[0].piece.box[2], s.ins[0].piece.box[2]);
  EXPECT_EQ(rk.outs[0].piece.box[2], s.ins[1].piece.box[2]);
  // Heads and head sizes stay whole: the causal time dim and the head dim are frozen.
  EXPECT_THROW(partition_one(m.g(), whole_op(m.g(), att), "t", 2, 0), NotSupported);
  EXPECT_THROW(partition_one(m.g(), whole_op(m.g(), att), "d", 2, 0), NotSupported);
}

TEST(LlamaPartition, MegatronPairsFallOutOfPropagation) {
  core::JobSpec s = llama_spec();
  s.parallel.tp = 2;
  ParallelConfig pc = resolve_parallel(s, 2);
  Llama m(s);
  std::vector<OpDecision> dec = decide_partitions(m.g(), pc);
  std::map<int, std::string> tp_symbol;
  for (const OpDecision& d : dec)
    for (const AxisSplit& a : d.splits)
      if (a.axis == Axis::kTp) tp_symbol[d.op] = a.symbol + "/" + std::to_string(a.groups);
  int checked = 0;
  for (const core::Op& o : m.g().ops()) {
    if (o.phase != core::Phase::kForward || o.layer != 0) continue;
    const std::string name = m.g().value(o.outputs[0]).name, got = tp_symbol[o.id];
    SCOPED_TRACE(name);
    std::string want;
    if (name.find("_proj.out") != std::string::npos)
      want = name.find("o_proj") != std::string::npos || name.find("down_proj") != std::string::npos ? "k/1" : "n/1";
    else if (o.type == "rope") want = "h/1";
    else if (o.type == "gqa_attention") want = "g/1";
    else if (o.type == "swiglu") want = "n/1";
    else if (o.type == "rmsnorm" || o.type == "add") want = "";
    else continue;
    EXPECT_EQ(got, want);
    ++checked;
  }
  EXPECT_EQ(checked, 15);  // 2 norms, 7 projections, 2 ropes, attention, swiglu, 2 adds
  for (const core::Op& o : m.g().ops()) {
    if (o.type == "embedding" || o.type == "cross_entropy") {
      EXPECT_EQ(tp_symbol[o.id], "v/1") << o.type;
    }
    if (o.type == "matmul") {
      EXPECT_EQ(tp_symbol[o.id], "n/1");  // the untied head, vocabulary-parallel
    }
  }
}

TEST(LlamaPartition, BackwardOpsShareTheirForwardSymbols) {
  Llama m;
  const std::map<std::string, std::string> sym = {{"linear", "n"}, {"rope", "h"}, {"gqa_attention", "g"},
                                                  {"swiglu", "n"}, {"embedding", "v"}, {"matmul", "n"}};
  int checked = 0;
  for (const core::Op& o : m.g().ops()) {
    if (o.phase != core::Phase::kBackward) continue;
    auto it = sym.find(m.g().op(o.mirror).type);
    if (it == sym.end()) continue;
    SCOPED_TRACE(o.type);
    SubOp f = partition_one(m.g(), whole_op(m.g(), o.mirror), it->second, 2, 1);
    SubOp b = partition_one(m.g(), whole_op(m.g(), o.id), it->second, 2, 1);
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
  EXPECT_GT(checked, 20);
}

TEST(LlamaPartition, TpMustDivideTheKvHeads) {
  core::JobSpec s = llama_spec();  // 8 heads, 2 KV heads
  s.parallel.tp = 4;
  ConfigError e = test_util::config_error([&] { resolve_parallel(s, 4); });
  EXPECT_EQ(e.field(), "parallel.tp");
  EXPECT_NE(std::string(e.what()).find("must divide model.kv_heads (2)"), std::string::npos) << e.what();
  s.parallel.tp = 2;
  EXPECT_NO_THROW(resolve_parallel(s, 2));
}

// The estimate's closed form (planner/memory_estimate.cc) against the graph's parameters,
// untied and tied; GPT's as a control.
TEST(LlamaMemoryEstimate, ParameterBytesMatchTheGraph) {
  core::JobSpec gpt = test_util::gpt_spec(2, 64, 8);
  core::JobSpec untied = llama_spec(), tied = llama_spec();
  tied.model.tie_embeddings = true;
  for (const core::JobSpec* s : {&gpt, &untied, &tied}) {
    core::ModelGraph mg = core::build_model(s->model, 1);
    double n = 0;
    for (int p : mg.graph.parameters()) {
      double k = 1;
      for (int64_t d : mg.graph.value(p).shape) k *= double(d);
      n += k;
    }
    EXPECT_DOUBLE_EQ(estimate_memory(*s, 1).parameters, 4 * n) << s->model.arch << " tied "
                                                                << s->model.tie_embeddings;
  }
}

}  // namespace
}  // namespace weft::planner
