// ZeRO at dp 3 on widths 3 does not divide (dim 32, MLP 128, vocabulary 256): every parameter
// is sharded unevenly (ceil(n / 3) rows, the last rank's shorter: planner/lower_step.cc,
// zero_shard), the reduce-scatters and all-gathers move uneven parts, and every stage still
// matches one process. A checkpoint written by those shards loads into dp 2 ZeRO-3 and into
// one process through the VPS router.
#include "tests/parallel/layout_harness.h"
#include "tests/parallel/resume_util.h"

namespace weft::test {
namespace {

// Two layers for speed; global batch 12 in micro-batches of 2 splits over dp 3, 2 and 1.
const std::vector<std::string> kUneven = {"model.layers=2", "train.global_batch=12",
                                          "train.micro_batch=2"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

void check(LayoutCase c) { expect_invariant(c, run_layout(c)); }

TEST(LayoutMatrix, Dp3Zero1Uneven) {
  check({"gpt-layout.yaml", 3, with(kUneven, {"parallel.dp=3", "parallel.zero=1"}), 6, kRegroup});
}

TEST(LayoutMatrix, Dp3Zero2Uneven) {
  check({"gpt-layout.yaml", 3, with(kUneven, {"parallel.dp=3", "parallel.zero=2"}), 6, kRegroup});
}

TEST(LayoutMatrix, Dp3Zero3Uneven) {
  check({"gpt-layout.yaml", 3, with(kUneven, {"parallel.dp=3", "parallel.zero=3"}), 6, kRegroup});
}

// Each tp lane's piece (16 of 32 columns or rows) is sharded over dp 3 on its own (6, 6, 4):
// the lanes' uneven shards end at different places, and each is searched apart.
TEST(LayoutMatrix, Dp3Tp2Zero1Uneven) {
  check({"gpt-layout.yaml", 6, with(kUneven, {"parallel.dp=3", "parallel.tp=2", "parallel.zero=1"}),
         6, kSplit});
}

TEST(LayoutMatrix, Dp3Tp2Zero3Uneven) {
  check({"gpt-layout.yaml", 6, with(kUneven, {"parallel.dp=3", "parallel.tp=2", "parallel.zero=3"}),
         6, kSplit});
}

// The checkpoint's shards are the uneven ZeRO-3 boxes (wte rows 0-86, 86-172, 172-256): the
// router intersects them with dp 2's even halves and with one process's whole tensors.
TEST(ZeroUnevenResume, Dp3Zero3SavedResumesUnderDp2Zero3) {
  resume::ResumeCase c;
  c.config = "gpt-layout.yaml";
  c.save_world = 3, c.save_sets = with(kUneven, {"parallel.dp=3", "parallel.zero=3"});
  c.resume_world = 2, c.resume_sets = with(kUneven, {"parallel.dp=2", "parallel.zero=3"});
  c.save_at = 4, c.steps = 7;
  resume::expect_resumed(c, resume::run_resume(c));
}

TEST(ZeroUnevenResume, Dp3Zero3SavedResumesOnOneProcess) {
  resume::ResumeCase c;
  c.config = "gpt-layout.yaml";
  c.save_world = 3, c.save_sets = with(kUneven, {"parallel.dp=3", "parallel.zero=3"});
  c.resume_world = 1, c.resume_sets = kUneven;
  c.save_at = 4, c.steps = 7;
  resume::expect_resumed(c, resume::run_resume(c));
}

}  // namespace
}  // namespace weft::test
