// The Llama layout matrix on 30 steps (label `long`), at layout_harness.h's tolerances:
// kRegroup where a layout only regroups sums (dp, pp, ZeRO), kSplit where tp splits a
// reduction inside a kernel. tp must divide the KV heads (2 here), so tp stays at 2.
#include <gtest/gtest.h>

#include "tests/parallel/layout_harness.h"

namespace weft::test {
namespace {

constexpr int kSteps = 30;
const char* kLlama = "llama-layout.yaml";

void check(LayoutCase c) { expect_invariant(c, run_layout(c)); }

TEST(LlamaLayoutMatrix, Dp2) { check({kLlama, 2, {"parallel.dp=2"}, kSteps, kRegroup}); }
TEST(LlamaLayoutMatrix, Tp2) { check({kLlama, 2, {"parallel.dp=1", "parallel.tp=2"}, kSteps, kSplit}); }
TEST(LlamaLayoutMatrix, Pp2OneFOneB) {
  check({kLlama, 2, {"parallel.dp=1", "parallel.pp=2", "parallel.pipeline.schedule=1f1b"}, kSteps, kRegroup});
}
TEST(LlamaLayoutMatrix, Dp2Tp2) { check({kLlama, 4, {"parallel.dp=2", "parallel.tp=2"}, kSteps, kSplit}); }
TEST(LlamaLayoutMatrix, Dp2Zero3) {
  check({kLlama, 2, {"parallel.dp=2", "parallel.zero=3"}, kSteps, kRegroup});
}
TEST(LlamaLayoutMatrix, Pp2Interleaved) {
  check({kLlama,
         2,
         {"parallel.dp=1", "parallel.pp=2", "parallel.pipeline.schedule=interleaved",
          "parallel.pipeline.virtual_stages=2"},
         kSteps,
         kRegroup});
}
TEST(LlamaLayoutMatrix, Pp2GPipe) {
  check({kLlama, 2, {"parallel.dp=1", "parallel.pp=2", "parallel.pipeline.schedule=gpipe"}, kSteps, kRegroup});
}
TEST(LlamaLayoutMatrix, Dp2Zero2) {
  check({kLlama, 2, {"parallel.dp=2", "parallel.zero=2"}, kSteps, kRegroup});
}
TEST(LlamaLayoutMatrix, Pp2UnevenLayout) {
  check({kLlama, 2, {"parallel.dp=1", "parallel.pp=2", "parallel.pipeline.layout=[[0],[1,2,3]]"}, kSteps,
         kRegroup});
}
TEST(LlamaLayoutMatrix, Dp2Zero1) {
  check({kLlama, 2, {"parallel.dp=2", "parallel.zero=1"}, kSteps, kRegroup});
}
// Recomputation re-runs grouped-query attention (selective) or every op of a layer (full).
TEST(LlamaLayoutMatrix, Tp2RecomputeSelective) {
  check({kLlama, 2, {"parallel.dp=1", "parallel.tp=2", "parallel.recompute=selective"}, kSteps, kSplit});
}
TEST(LlamaLayoutMatrix, Pp2RecomputeFull) {
  check({kLlama, 2, {"parallel.dp=1", "parallel.pp=2", "parallel.recompute=full"}, kSteps, kRegroup});
}
// Memory planning (memory.allocator: planned): each rank traces its first step and serves
// the rest from the planned arena; the numbers are the caching allocator's.
TEST(LlamaLayoutMatrix, Tp2PlannedMemory) {
  check({kLlama, 2, {"parallel.dp=1", "parallel.tp=2", "memory.allocator=planned"}, kSteps, kSplit});
}
TEST(LlamaLayoutMatrix, Pp2PlannedMemory) {
  check({kLlama, 2, {"parallel.dp=1", "parallel.pp=2", "memory.allocator=planned"}, kSteps, kRegroup});
}
// Tied head: embed_tokens is also the LM head, vocabulary-parallel under tp and held by
// the first and the last stage under pp.
TEST(LlamaLayoutMatrix, Tp2TiedHead) {
  check({kLlama, 2, {"parallel.dp=1", "parallel.tp=2", "model.tie_embeddings=true"}, kSteps, kSplit});
}
TEST(LlamaLayoutMatrix, Pp2TiedHead) {
  check({kLlama, 2, {"parallel.dp=1", "parallel.pp=2", "model.tie_embeddings=true"}, kSteps, kRegroup});
}

}  // namespace
}  // namespace weft::test
