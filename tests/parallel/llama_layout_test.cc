// Layout invariance of the Llama block in CI (bounded): tensor parallelism by KV heads and a
// 1F1B pipeline, each against the single-process run; the rest of the Llama matrix is in
// llama_layout_long_test.cc (label `long`).
#include <gtest/gtest.h>

#include "tests/parallel/layout_harness.h"

namespace weft::test {
namespace {

const char* kLlama = "llama-layout.yaml";

void check(LayoutCase c) { expect_invariant(c, run_layout(c)); }

TEST(LlamaLayoutInvariance, Tp2) { check({kLlama, 2, {"parallel.dp=1", "parallel.tp=2"}, 6, kSplit}); }
TEST(LlamaLayoutInvariance, Pp2OneFOneB) {
  check({kLlama, 2, {"parallel.dp=1", "parallel.pp=2", "parallel.pipeline.schedule=1f1b"}, 6, kRegroup});
}

}  // namespace
}  // namespace weft::test
