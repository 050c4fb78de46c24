// Expert balancing over the global batch on real ranks: aux_loss_global (shares reduced over
// every rank before the first backward) and loss_free (bias moved from the global load after
// each step) give the single-process numbers on every layout. The CI set; more layouts in
// layout_long_test.cc (label `long`).
#include <gtest/gtest.h>

#include "base/error.h"
#include "planner/policy.h"
#include "tests/parallel/layout_harness.h"

namespace weft::test {
namespace {

void check(LayoutCase c) { expect_invariant(c, run_layout(c)); }

const char* kMoe = "moe-layout.yaml";
const char* kGlobal = "model.moe.balance=aux_loss_global";
const char* kFree = "model.moe.balance=loss_free";
// A rate that flips routings within a few steps, so that a wrong bias would show.
const char* kFastBias = "model.moe.bias_update_rate=0.01";

TEST(MoeBalanceLayout, GlobalSharesDp2) {
  check({kMoe, 2, {kGlobal, "parallel.dp=2"}, 6, kRegroup});
}
TEST(MoeBalanceLayout, GlobalSharesEp2) {
  check({kMoe, 2, {kGlobal, "parallel.dp=1", "parallel.ep=2"}, 6, kRegroup});
}
TEST(MoeBalanceLayout, GlobalSharesPp2Gpipe) {
  check({kMoe, 2, {kGlobal, "parallel.dp=1", "parallel.pp=2", "parallel.pipeline.schedule=gpipe"}, 6, kRegroup});
}
TEST(MoeBalanceLayout, LossFreeDp2) {
  check({kMoe, 2, {kFree, kFastBias, "parallel.dp=2"}, 6, kRegroup});
}
TEST(MoeBalanceLayout, LossFreeTp2) {  // replicated routings count alike on both lanes
  check({kMoe, 2, {kFree, kFastBias, "parallel.dp=1", "parallel.tp=2"}, 6, kSplit});
}

TEST(MoeBalanceLayout, GlobalSharesRefuseAnInterleavingSchedule) {
  core::JobSpec s = layout_spec({kMoe, 2, {kGlobal, "parallel.dp=1", "parallel.pp=2",
                                           "parallel.pipeline.schedule=1f1b"}});
  try {
    planner::resolve_parallel(s, 2);
    FAIL() << "1f1b with aux_loss_global was accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "parallel.pipeline.schedule");
    EXPECT_NE(std::string(e.what()).find("gpipe"), std::string::npos) << e.what();
  }
  // One stage: the order is the planner's to choose; every forward goes first.
  core::JobSpec one = layout_spec({kMoe, 2, {kGlobal, "parallel.dp=2"}});
  EXPECT_EQ(planner::resolve_parallel(one, 2).schedule, "gpipe");
}

}  // namespace
}  // namespace weft::test
