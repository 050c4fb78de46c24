// Multi-rank checkpoints, the quick cases: save under dp2 x tp2 and resume under pp2 (a
// different layout, 1e-6 of the uninterrupted single process); dp2 -> dp2 bit for bit.
// The other layouts and MoE are in checkpoint_resume_long_test.cc.
#include "tests/parallel/resume_util.h"

namespace weft::test::resume {
namespace {

TEST(ParallelResume, Dp2Tp2SavedAtStep10ResumesUnderPp2) {
  ResumeCase c;
  c.config = "gpt-layout.yaml";
  c.save_world = 4, c.save_sets = {"parallel.dp=2", "parallel.tp=2"};
  c.resume_world = 2, c.resume_sets = {"parallel.pp=2"};
  expect_resumed(c, run_resume(c));
}

TEST(ParallelResume, Dp2ResumesUnderDp2BitForBit) {
  ResumeCase c;
  c.config = "gpt-layout.yaml";
  c.save_world = 2, c.save_sets = {"parallel.dp=2"};
  c.resume_world = 2, c.resume_sets = {"parallel.dp=2"};
  c.bitwise = true;
  expect_resumed(c, run_resume(c));
}

}  // namespace
}  // namespace weft::test::resume
