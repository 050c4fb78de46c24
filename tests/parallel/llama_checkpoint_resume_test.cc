// Llama checkpoints across layouts: saved under tp2 (KV heads split, state held under its
// Hugging Face names) and resumed under pp2, within 1e-6 of the uninterrupted process.
#include "tests/parallel/resume_util.h"

namespace weft::test::resume {
namespace {

TEST(LlamaParallelResume, Tp2SavedAtStep10ResumesUnderPp2) {
  ResumeCase c;
  c.config = "llama-layout.yaml";
  c.save_world = 2, c.save_sets = {"parallel.dp=1", "parallel.tp=2"};
  c.resume_world = 2, c.resume_sets = {"parallel.dp=1", "parallel.pp=2"};
  expect_resumed(c, run_resume(c));
}

}  // namespace
}  // namespace weft::test::resume
