// ZeRO at dp 3 on widths 3 does not divide (dim 32, MLP 128, vocabulary 256): every parameter
// is sharded unevenly (ceil(n / 3) rows, the last rank's shorter: planner/lower_step.cc,
// zero_shard), the reduce-scatters and all-gathers move uneven parts, and every stage still
// matches one process. A checkpoint written by those shards loads into dp 2 ZeRO-3 and into
// one process through the VPS router. The same where the holders are the ep lanes of one
// replica (dp 1, ep 3: lane 2's role holds the short shards) and for the qkv bias under tp 2
// (only a strided dim: each of dp 3 holds one of its lane's q, k and v chunks).
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

// MoE with 3 experts over ep 3 at dp 1: the dense parameters' holders are the three ep lanes
// (dim 32 over 3 = 11, 11, 10); seq_len 12 so that ep 3 divides each lane's routed rows.
const std::vector<std::string> kEp3 =
    with(kUneven, {"model.moe.experts=3", "model.seq_len=12", "parallel.dp=1", "parallel.ep=3"});

TEST(LayoutMatrix, Dp3Zero1Uneven) {
  check({"gpt-layout.yaml", 3, with(kUneven, {"parallel.dp=3", "parallel.zero=1"}), 6, kRegroup});
}

TEST(LayoutMatrix, Dp3Zero2Uneven) {
  check({"gpt-layout.yaml", 3, with(kUneven, {"parallel.dp=3", "parallel.zero=2"}), 6, kRegroup});
}

TEST(LayoutMatrix, Dp3Zero3Uneven) {
  check({"gpt-layout.yaml", 3, with(kUneven, {"parallel.dp=3", "parallel.zero=3"}), 6, kRegroup});
}

TEST(LayoutMatrix, Dp1Ep3Zero1Uneven) {
  check({"moe-layout.yaml", 3, with(kEp3, {"parallel.zero=1"}), 6, kRegroup});
}

TEST(LayoutMatrix, Dp1Ep3Zero3Uneven) {
  check({"moe-layout.yaml", 3, with(kEp3, {"parallel.zero=3"}), 6, kRegroup});
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

// The ep lanes' uneven shards (lane 2 holds rows 22-32 of every dim-32 vector) resume as
// one process's whole tensors.
TEST(ZeroUnevenResume, Dp1Ep3Zero3SavedResumesOnOneProcess) {
  resume::ResumeCase c;
  c.config = "moe-layout.yaml";
  c.save_world = 3, c.save_sets = with(kEp3, {"parallel.zero=3"});
  c.resume_world = 1;
  c.resume_sets = with(kUneven, {"model.moe.experts=3", "model.seq_len=12"});
  c.save_at = 4, c.steps = 7;
  resume::expect_resumed(c, resume::run_resume(c));
}

// The qkv bias's whole-chunk shards (rank d of each tp lane holds its q, k or v rows) meet
// dp 2's halves of every chunk.
TEST(ZeroUnevenResume, Dp3Tp2Zero3SavedResumesUnderDp2Zero3) {
  resume::ResumeCase c;
  c.config = "gpt-layout.yaml";
  c.save_world = 6;
  c.save_sets = with(kUneven, {"parallel.dp=3", "parallel.tp=2", "parallel.zero=3"});
  c.resume_world = 2, c.resume_sets = with(kUneven, {"parallel.dp=2", "parallel.zero=3"});
  c.save_at = 4, c.steps = 7;
  resume::expect_resumed(c, resume::run_resume(c));
}

}  // namespace
}  // namespace weft::test
