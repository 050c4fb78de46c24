// Multi-rank checkpoints, the quick cases: save under dp2 x tp2 and resume under pp2 (a
// different layout, 1e-6 of the uninterrupted single process); dp2 -> dp2 bit for bit; a
// stale or corrupted newer folder is skipped by every rank alike.
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

// Under a root holding a stale copy (step-99999999) and a corrupted step 2, every rank of a
// pp2 resume loads step 1: rank 0 chooses, the others follow, none hangs.
TEST(ParallelResume, EveryRankSkipsAStaleAndACorruptedFolderAlike) {
  fs::path root = fs::temp_directory_path() / ("weft_resume_skip_" + std::to_string(::getpid()));
  fs::remove_all(root);
  save_dp2(root.string(), 2, 1);
  fs::copy(root / "step-00000002", root / "step-99999999");
  const fs::path shard = root / "step-00000002" / "shard-00000.bin";
  ASSERT_TRUE(fs::exists(shard));
  fs::resize_file(shard, fs::file_size(shard) - 1);
  ResumeCase c;
  c.config = "gpt-layout.yaml";
  core::JobSpec spec = spec_with(c, {"parallel.pp=2"}, (root / "unused").string(), 0);
  RunResult r = run_ranks(2, [&](RankContext& ctx) {
    std::unique_ptr<comm::Store> store;
    auto world = world_of(ctx, store, "resume");
    parallel::ParallelTrainer pt(spec, *world);
    checkpoint::ParallelCheckpoints ck(spec, pt, root.string());
    EXPECT_EQ(pt.current_step(), 1) << "rank " << ctx.rank();
    EXPECT_FALSE(parallel::agree_stop(*world, false));
  });
  EXPECT_TRUE(r.ok()) << r.summary();
  fs::remove_all(root);
}

}  // namespace
}  // namespace weft::test::resume
