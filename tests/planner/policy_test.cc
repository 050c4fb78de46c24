// Policies: degree resolution, validation with named fields, rank order, stage layout and
// the Megatron decisions that tensor-parallel propagation arrives at.
#include <gtest/gtest.h>

#include "planner/lower.h"
#include "planner/policy.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {
using test_util::config_error;
using test_util::gpt_spec;

std::string msg(const ConfigError& e) { return e.what(); }

TEST(Policy, AutoFillsWhatTheWorldLeavesDpFirst) {
  core::JobSpec s = gpt_spec(4);
  s.train.global_batch = 64;
  s.parallel.tp = 2;
  s.parallel.pp = 2;
  ParallelConfig pc = resolve_parallel(s, 16);
  EXPECT_EQ(pc.deg.dp, 4);
  EXPECT_EQ(pc.micro_batches, 64 / (2 * 4));
  s.parallel.dp = 2;
  s.parallel.tp = 0;  // auto, dp fixed: tp takes the rest
  pc = resolve_parallel(s, 16);
  EXPECT_EQ(pc.deg.tp, 4);
  EXPECT_EQ(pc.deg.world(), 16);
}

TEST(Policy, DegreesMustMultiplyToTheWorld) {
  core::JobSpec s = gpt_spec();
  s.parallel.dp = 3;
  s.parallel.tp = 2;
  ConfigError e = config_error([&] { resolve_parallel(s, 8); });
  EXPECT_EQ(e.field(), "parallel.dp");
  EXPECT_NE(msg(e).find("try dp=4"), std::string::npos) << msg(e);
  s.parallel.dp = 0;
  s.parallel.tp = 3;
  e = config_error([&] { resolve_parallel(s, 8); });
  EXPECT_EQ(e.field(), "parallel.tp");
  EXPECT_NE(msg(e).find("try tp="), std::string::npos) << msg(e);
}

TEST(Policy, SplitDimsMustDivide) {
  core::JobSpec s = gpt_spec(2, 48, 6, 256);
  s.parallel.tp = 4;  // 6 heads
  ConfigError e = config_error([&] { resolve_parallel(s, 8); });
  EXPECT_EQ(e.field(), "parallel.tp");
  EXPECT_NE(msg(e).find("model.heads (6)"), std::string::npos) << msg(e);
  EXPECT_NE(msg(e).find("try tp=1 or tp=2"), std::string::npos) << msg(e);
  // The vocabulary need not divide (balanced slices), but every lane needs a row.
  s = gpt_spec(2, 64, 4, 250);
  s.parallel.tp = 4;
  EXPECT_EQ(resolve_parallel(s, 4).deg.tp, 4);
  s.model.vocab = 3;
  e = config_error([&] { resolve_parallel(s, 4); });
  EXPECT_EQ(e.field(), "parallel.tp");
  EXPECT_NE(msg(e).find("model.vocab (3)"), std::string::npos) << msg(e);
  EXPECT_NE(msg(e).find("try tp=1 or tp=2"), std::string::npos) << msg(e);

  core::JobSpec m = test_util::moe_spec(6, 2);
  m.parallel.ep = 4;
  e = config_error([&] { resolve_parallel(m, 8); });
  EXPECT_EQ(e.field(), "parallel.ep");
  EXPECT_NE(msg(e).find("try ep="), std::string::npos) << msg(e);
  core::JobSpec d = gpt_spec();
  d.parallel.ep = 2;
  EXPECT_EQ(config_error([&] { resolve_parallel(d, 2); }).field(), "parallel.ep");
}

// Issue 12: tp=3 with vocab 256 and tp=2 with GPT-2's 50257 were refused ("pad it").
TEST(Policy, AnyTpThatDividesHeadsAndWidthsTakesAnyVocabulary) {
  core::JobSpec s = gpt_spec(2, 96, 6, 256);
  s.parallel.tp = 3;
  EXPECT_EQ(resolve_parallel(s, 3).deg.tp, 3);
  s = gpt_spec(2, 64, 4, 50257);
  s.parallel.tp = 2;
  EXPECT_EQ(resolve_parallel(s, 4).deg.tp, 2);
  // A tp that does not divide the heads still names the heads.
  s = gpt_spec(2, 96, 6, 257);
  s.parallel.tp = 4;
  ConfigError e = config_error([&] { resolve_parallel(s, 4); });
  EXPECT_EQ(e.field(), "parallel.tp");
  EXPECT_NE(msg(e).find("model.heads (6)"), std::string::npos) << msg(e);
}

TEST(Policy, GlobalBatchSplitsIntoMicroBatchesAndReplicas) {
  core::JobSpec s = gpt_spec();
  s.train.global_batch = 12;
  s.train.micro_batch = 2;
  ConfigError e = config_error([&] { resolve_parallel(s, 4); });
  EXPECT_EQ(e.field(), "train.global_batch");
  EXPECT_NE(msg(e).find("try global_batch=16"), std::string::npos) << msg(e);
  s.train.global_batch = 16;
  s.parallel.pipeline.micro_batches = 3;
  e = config_error([&] { resolve_parallel(s, 4); });
  EXPECT_EQ(e.field(), "parallel.pipeline.micro_batches");
  EXPECT_NE(msg(e).find("try micro_batches=2"), std::string::npos) << msg(e);
}

TEST(Policy, LayoutCoversEveryLayerOnceAndIsKept) {
  core::JobSpec s = gpt_spec(6);
  s.parallel.pp = 2;
  s.parallel.pipeline.layout = {{0, 1}, {2, 3, 4, 5}};
  ParallelConfig pc = resolve_parallel(s, 2);
  EXPECT_EQ(pc.chunks, (std::vector<std::vector<int64_t>>{{0, 1}, {2, 3, 4, 5}}));
  EXPECT_TRUE(pc.layout_given);
  for (auto bad : std::vector<std::vector<std::vector<int64_t>>>{
           {{0, 1}, {2, 3, 4}}, {{0, 1, 1}, {2, 3, 4, 5}}, {{0, 1}, {3, 2, 4, 5}}, {{0, 1, 2, 3, 4, 5}}}) {
    s.parallel.pipeline.layout = bad;
    EXPECT_EQ(config_error([&] { resolve_parallel(s, 2); }).field(), "parallel.pipeline.layout");
  }
  // Default: even split, a remainder to the middle stages; never a layer dropped.
  s.parallel.pipeline.layout.clear();
  s.model.layers = 10;
  s.parallel.pp = 4;
  pc = resolve_parallel(s, 4);
  std::vector<size_t> sizes;
  int64_t covered = 0;
  for (const auto& c : pc.chunks) sizes.push_back(c.size()), covered += int64_t(c.size());
  EXPECT_EQ(sizes, (std::vector<size_t>{2, 3, 3, 2}));
  EXPECT_EQ(covered, 10);
}

TEST(Policy, VirtualStagesNeedPipelineAndEvenChunks) {
  core::JobSpec s = gpt_spec(4);
  s.parallel.pipeline.schedule = "interleaved";
  s.parallel.pipeline.virtual_stages = 2;
  EXPECT_EQ(config_error([&] { resolve_parallel(s, 1); }).field(), "parallel.pipeline.virtual_stages");
  s.parallel.pp = 2;
  s.model.layers = 6;  // 6 layers into 4 chunks
  EXPECT_EQ(config_error([&] { resolve_parallel(s, 2); }).field(), "parallel.pipeline.virtual_stages");
  s.model.layers = 8;
  ParallelConfig pc = resolve_parallel(s, 2);
  EXPECT_EQ(pc.chunk_count(), 4);
  EXPECT_EQ(pc.chunk_stage(3), 1);
}

TEST(Mesh, FirstAxisOfTheOrderVariesFastest) {
  Mesh m(Degrees{2, 2, 2, 1}, parse_order("tp-ep-dp-pp"));
  EXPECT_EQ(m.coord(1).tp, 1);
  EXPECT_EQ(m.coord(2).dp, 1);
  EXPECT_EQ(m.coord(4).pp, 1);
  Mesh d(Degrees{2, 2, 2, 1}, parse_order("dp-tp-ep-pp"));
  EXPECT_EQ(d.coord(1).dp, 1);
  EXPECT_EQ(d.coord(2).tp, 1);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(m.rank(m.coord(r)), r);
  EXPECT_EQ(config_error([] { parse_order("tp-dp-pp"); }).field(), "parallel.order");
}

TEST(Policy, MegatronPairsFallOutOfPropagation) {
  core::JobSpec s = gpt_spec(2);
  s.parallel.tp = 2;
  ParallelConfig pc = resolve_parallel(s, 2);
  core::ModelGraph mg = core::build_model(s.model, s.train.global_batch);
  core::add_training_ops(mg, s.train);
  std::vector<OpDecision> dec = decide_partitions(mg.graph, pc);
  auto tp_split = [&](int op) -> AxisSplit {
    for (const OpDecision& d : dec)
      if (d.op == op)
        for (const AxisSplit& a : d.splits)
          if (a.axis == Axis::kTp) return a;
    return {};
  };
  for (const core::Op& o : mg.graph.ops()) {
    if (o.phase != core::Phase::kForward) continue;
    AxisSplit a = tp_split(o.id);
    std::string name = mg.graph.value(o.outputs[0]).name;
    SCOPED_TRACE(name);
    if (name.find("attn.qkv") != std::string::npos) {
      EXPECT_EQ(a, (AxisSplit{Axis::kTp, "n", 2, 3}));
    } else if (name.find("attn.proj") != std::string::npos || name.find("mlp.proj") != std::string::npos) {
      EXPECT_EQ(a.symbol, "k");
    } else if (name.find("mlp.fc") != std::string::npos || name.find("gelu") != std::string::npos) {
      EXPECT_EQ(a.symbol, "n");
    } else if (o.type == "attention") {
      EXPECT_EQ(a.symbol, "h");
    } else if (o.type == "embedding" || o.type == "cross_entropy") {
      EXPECT_EQ(a.symbol, "v");
    } else if (o.type == "layernorm" || o.type == "add") {
      EXPECT_EQ(a.symbol, "");
    }
  }
  // Stage placement: embedding on the first chunk, the head on the last.
  s.parallel.pp = 2;
  s.parallel.tp = 1;
  pc = resolve_parallel(s, 2);
  GraphInfo gi(mg.graph, pc, decide_partitions(mg.graph, pc));
  for (const core::Op& o : mg.graph.ops()) {
    if (o.type == "embedding") {
      EXPECT_EQ(gi.op_chunk[size_t(o.id)], 0);
    }
    if (o.type == "cross_entropy" || o.scope == "ln_f") {
      EXPECT_EQ(gi.op_chunk[size_t(o.id)], 1);
    }
    if (o.phase == core::Phase::kBackward) {
      EXPECT_EQ(gi.op_chunk[size_t(o.id)], gi.op_chunk[size_t(o.mirror)]);
    }
  }
}

}  // namespace
}  // namespace weft::planner
