// Layout invariance in CI: a bounded set of layouts (dp, pp 1f1b, tp, ZeRO-1, ep) on a few
// steps; the full matrix on 30 steps is layout_long_test.cc (label `long`).
#include <gtest/gtest.h>

#include "tests/parallel/layout_harness.h"

namespace weft::test {
namespace {

void check(LayoutCase c) { expect_invariant(c, run_layout(c)); }

TEST(LayoutInvariance, Dp2) { check({"gpt-layout.yaml", 2, {"parallel.dp=2"}, 6, kRegroup}); }
TEST(LayoutInvariance, Pp2OneFOneB) {
  check({"gpt-layout.yaml",
         2,
         {"parallel.dp=1", "parallel.pp=2", "parallel.pipeline.schedule=1f1b"},
         6,
         kRegroup});
}
TEST(LayoutInvariance, Dp2Zero1) {
  check({"gpt-layout.yaml", 2, {"parallel.dp=2", "parallel.zero=1"}, 6, kRegroup});
}
TEST(LayoutInvariance, Tp2) {
  check({"gpt-layout.yaml", 2, {"parallel.dp=1", "parallel.tp=2"}, 6, kSplit});
}
TEST(LayoutInvariance, MoeEp2) {
  check({"moe-layout.yaml", 2, {"parallel.dp=1", "parallel.ep=2"}, 6, kRegroup});
}

}  // namespace
}  // namespace weft::test
