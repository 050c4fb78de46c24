// The full layout matrix of issue 5 on 30 steps (label `long`): every layout's per-step loss,
// gradient norm and final weights against the single-process run, at the tolerances of
// layout_harness.h (kRegroup where the layout only regroups sums: DP, PP, EP, ZeRO; kSplit
// where tensor parallelism splits a reduction inside a kernel).
#include <gtest/gtest.h>

#include "tests/parallel/layout_harness.h"

namespace weft::test {
namespace {

constexpr int kSteps = 30;
const char* kGpt = "gpt-layout.yaml";
const char* kMoe = "moe-layout.yaml";

void check(LayoutCase c) { expect_invariant(c, run_layout(c)); }

TEST(LayoutMatrix, Dp2) { check({kGpt, 2, {"parallel.dp=2"}, kSteps, kRegroup}); }
TEST(LayoutMatrix, Dp4) { check({kGpt, 4, {"parallel.dp=4"}, kSteps, kRegroup}); }
TEST(LayoutMatrix, Pp2OneFOneB) {
  check({kGpt,
         2,
         {"parallel.dp=1", "parallel.pp=2", "parallel.pipeline.schedule=1f1b"},
         kSteps,
         kRegroup});
}
TEST(LayoutMatrix, Pp2GPipe) {
  check({kGpt,
         2,
         {"parallel.dp=1", "parallel.pp=2", "parallel.pipeline.schedule=gpipe"},
         kSteps,
         kRegroup});
}
TEST(LayoutMatrix, Dp2Zero1) {
  check({kGpt, 2, {"parallel.dp=2", "parallel.zero=1"}, kSteps, kRegroup});
}
TEST(LayoutMatrix, Dp2Zero2) {
  check({kGpt, 2, {"parallel.dp=2", "parallel.zero=2"}, kSteps, kRegroup});
}
TEST(LayoutMatrix, Dp2Zero3) {
  check({kGpt, 2, {"parallel.dp=2", "parallel.zero=3"}, kSteps, kRegroup});
}
TEST(LayoutMatrix, Tp2) { check({kGpt, 2, {"parallel.dp=1", "parallel.tp=2"}, kSteps, kSplit}); }
TEST(LayoutMatrix, Tp4) { check({kGpt, 4, {"parallel.dp=1", "parallel.tp=4"}, kSteps, kSplit}); }
TEST(LayoutMatrix, Dp2Tp2) { check({kGpt, 4, {"parallel.dp=2", "parallel.tp=2"}, kSteps, kSplit}); }
TEST(LayoutMatrix, Tp2Pp2) {
  check({kGpt, 4, {"parallel.dp=1", "parallel.tp=2", "parallel.pp=2"}, kSteps, kSplit});
}
TEST(LayoutMatrix, Dp2Pp2Zero1) {
  check({kGpt, 4, {"parallel.dp=2", "parallel.pp=2", "parallel.zero=1"}, kSteps, kRegroup});
}
TEST(LayoutMatrix, Pp4Interleaved) {
  check({kGpt,
         4,
         {"parallel.dp=1", "parallel.pp=4", "parallel.pipeline.schedule=interleaved",
          "parallel.pipeline.virtual_stages=2"},
         kSteps,
         kRegroup});
}
TEST(LayoutMatrix, Dp2Tp2Pp2) {
  check({kGpt, 8, {"parallel.dp=2", "parallel.tp=2", "parallel.pp=2"}, kSteps, kSplit});
}
// Beyond the list: ZeRO shards of tensor-parallel pieces (the qkv shard is 1/n of each
// of three strided chunks), experts split by hidden units, ZeRO over expert parallelism.
TEST(LayoutMatrix, Dp2Tp2Zero1) {
  check({kGpt, 4, {"parallel.dp=2", "parallel.tp=2", "parallel.zero=1"}, kSteps, kSplit});
}
TEST(LayoutMatrix, MoeTp2) { check({kMoe, 2, {"parallel.dp=1", "parallel.tp=2"}, kSteps, kSplit}); }
TEST(LayoutMatrix, MoeEp2Dp2Zero1) {
  check({kMoe, 4, {"parallel.dp=2", "parallel.ep=2", "parallel.zero=1"}, kSteps, kRegroup});
}
TEST(LayoutMatrix, MoeDp2) { check({kMoe, 2, {"parallel.dp=2"}, kSteps, kRegroup}); }
TEST(LayoutMatrix, MoeEp2) {
  check({kMoe, 2, {"parallel.dp=1", "parallel.ep=2"}, kSteps, kRegroup});
}
TEST(LayoutMatrix, MoeEp4) {
  check({kMoe, 4, {"parallel.dp=1", "parallel.ep=4"}, kSteps, kRegroup});
}
TEST(LayoutMatrix, MoeEp2Dp2) {
  check({kMoe, 4, {"parallel.dp=2", "parallel.ep=2"}, kSteps, kRegroup});
}
// Balancing over the global batch (the CI set is moe_balance_layout_test.cc).
const char* kGlobal = "model.moe.balance=aux_loss_global";
const char* kFree = "model.moe.balance=loss_free";
TEST(LayoutMatrix, MoeGlobalSharesEp2Dp2) {
  check({kMoe, 4, {kGlobal, "parallel.dp=2", "parallel.ep=2"}, kSteps, kRegroup});
}
TEST(LayoutMatrix, MoeGlobalSharesDp2Tp2) {
  check({kMoe, 4, {kGlobal, "parallel.dp=2", "parallel.tp=2"}, kSteps, kSplit});
}
TEST(LayoutMatrix, MoeGlobalSharesDp2Pp2GpipeZero1) {
  check({kMoe, 4, {kGlobal, "parallel.dp=2", "parallel.pp=2", "parallel.zero=1",
                   "parallel.pipeline.schedule=gpipe"}, kSteps, kRegroup});
}
TEST(LayoutMatrix, MoeLossFreeEp4) {
  check({kMoe, 4, {kFree, "parallel.dp=1", "parallel.ep=4"}, kSteps, kRegroup});
}
TEST(LayoutMatrix, MoeLossFreePp2OneFOneB) {
  check({kMoe, 2, {kFree, "parallel.dp=1", "parallel.pp=2", "parallel.pipeline.schedule=1f1b"}, kSteps,
         kRegroup});
}
TEST(LayoutMatrix, MoeLossFreePp4Interleaved) {
  check({kMoe, 4, {kFree, "parallel.dp=1", "parallel.pp=4", "parallel.pipeline.schedule=interleaved",
                   "parallel.pipeline.virtual_stages=2"}, kSteps, kRegroup});
}
TEST(LayoutMatrix, MoeLossFreeEp2Dp2) {
  check({kMoe, 4, {kFree, "parallel.dp=2", "parallel.ep=2"}, kSteps, kRegroup});
}

}  // namespace
}  // namespace weft::test
