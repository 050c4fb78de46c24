// Multi-rank checkpoints with a buffer (loss_free's routing bias, StateKind::kBuffer):
// MoE saved under dp2 at step 4 resumes on one process within 1e-6 of the uninterrupted
// single process, and under dp2 bit for bit. A bias step of 0.05 moves the top-2 choice
// within a few steps, so a resume that lost the bias would not match.
#include "tests/parallel/resume_util.h"

namespace weft::test::resume {
namespace {

ResumeCase loss_free_case() {
  ResumeCase c;
  c.config = "moe-layout.yaml";
  const std::vector<std::string> lf = {"model.moe.balance=loss_free",
                                       "model.moe.bias_update_rate=0.05", "train.warmup_steps=2"};
  c.save_world = 2, c.save_sets = lf;
  c.save_sets.push_back("parallel.dp=2");
  c.resume_sets = lf;
  c.save_at = 4, c.steps = 7;  // checkpoint.every = save_at: one save, at step 4
  return c;
}

TEST(ParallelResumeBuffer, LossFreeDp2ResumesOnOneProcess) {
  ResumeCase c = loss_free_case();
  c.resume_world = 1;
  expect_resumed(c, run_resume(c));
}

TEST(ParallelResumeBuffer, LossFreeDp2ResumesUnderEp2) {
  ResumeCase c = loss_free_case();
  c.resume_world = 2;
  c.resume_sets.push_back("parallel.ep=2");
  expect_resumed(c, run_resume(c));
}

TEST(ParallelResumeBuffer, LossFreeDp2ResumesUnderDp2BitForBit) {
  ResumeCase c = loss_free_case();
  c.resume_world = 2;
  c.resume_sets.push_back("parallel.dp=2");
  c.bitwise = true;
  expect_resumed(c, run_resume(c));
}

}  // namespace
}  // namespace weft::test::resume
