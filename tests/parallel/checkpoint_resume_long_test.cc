// Multi-rank checkpoints, the slower cases: dp2 x tp2 saved at step 10 resumed under one
// process and under dp4 with zero1; MoE saved under ep2 resumed under ep4 and one process;
// a resume with another seed or a corrupted shard refused on every rank.
#include <sys/wait.h>

#include "core/io/metrics.h"
#include "tests/parallel/resume_util.h"

namespace weft::test::resume {
namespace {

TEST(ParallelResumeLong, Dp2Tp2ResumesOnOneProcess) {
  ResumeCase c;
  c.config = "gpt-layout.yaml";
  c.save_world = 4, c.save_sets = {"parallel.dp=2", "parallel.tp=2"};
  c.resume_world = 1;
  expect_resumed(c, run_resume(c));
}

TEST(ParallelResumeLong, Dp2Tp2ResumesUnderDp4Zero1) {
  ResumeCase c;
  c.config = "gpt-layout.yaml";
  c.save_world = 4, c.save_sets = {"parallel.dp=2", "parallel.tp=2"};
  c.resume_world = 4, c.resume_sets = {"parallel.dp=4", "parallel.zero=1"};
  expect_resumed(c, run_resume(c));
}

TEST(ParallelResumeLong, MoeEp2ResumesUnderEp4) {
  ResumeCase c;
  c.config = "moe-layout.yaml";
  c.save_world = 2, c.save_sets = {"parallel.ep=2"};
  c.resume_world = 4, c.resume_sets = {"parallel.ep=4"};
  expect_resumed(c, run_resume(c));
}

TEST(ParallelResumeLong, MoeEp2ResumesOnOneProcess) {
  ResumeCase c;
  c.config = "moe-layout.yaml";
  c.save_world = 2, c.save_sets = {"parallel.ep=2"};
  c.resume_world = 1;
  expect_resumed(c, run_resume(c));
}

TEST(ParallelResumeLong, Ep2ResumesUnderEp2BitForBit) {
  ResumeCase c;
  c.config = "moe-layout.yaml";
  c.save_world = 2, c.save_sets = {"parallel.ep=2"};
  c.resume_world = 2, c.resume_sets = {"parallel.ep=2"};
  c.bitwise = true;
  expect_resumed(c, run_resume(c));
}

// Every rank of a pp2 resume must fail with ConfigError("--resume", ...) naming `what`
// (its own reason or another rank's), none hang, and the trainer stays at step 0.
// `rank1_root`, when set, is what rank 1 resumes from instead (a folder it cannot see).
void expect_refused(const std::string& root, const std::vector<std::string>& sets,
                    const std::string& what, const std::string& rank1_root = {}) {
  ResumeCase c;
  c.config = "gpt-layout.yaml";
  core::JobSpec spec = spec_with(c, sets, root + "-unused", 0);
  RunResult r = run_ranks(2, [&](RankContext& ctx) {
    std::unique_ptr<comm::Store> store;
    auto world = world_of(ctx, store, "resume");
    parallel::ParallelTrainer pt(spec, *world);
    try {
      checkpoint::ParallelCheckpoints ck(
          spec, pt, ctx.rank() == 1 && !rank1_root.empty() ? rank1_root : root);
      ADD_FAILURE() << "rank " << ctx.rank() << " resumed";
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.field(), "--resume");
      const std::string msg = e.what();
      EXPECT_TRUE(msg.find(what) != std::string::npos ||
                  msg.find("another rank") != std::string::npos)
          << msg;
      std::printf("[resume] rank %d refused: %s\n", ctx.rank(), msg.c_str());
    }
    EXPECT_EQ(pt.current_step(), 0);
    // The ranks are still in step: a collective after the refusal completes.
    EXPECT_FALSE(parallel::agree_stop(*world, false));
  });
  ASSERT_TRUE(r.ok()) << r.summary();
}

TEST(ParallelResumeLong, AnotherSeedIsRefusedOnEveryRank) {
  fs::path root = fs::temp_directory_path() / ("weft_resume_seed_" + std::to_string(::getpid()));
  fs::remove_all(root);
  save_dp2(root.string(), 2, 2);
  expect_refused(root.string(), {"parallel.pp=2", "train.seed=99"}, "train.seed");
  fs::remove_all(root);
}

TEST(ParallelResumeLong, ACorruptedShardFailsEveryRankAndLoadsNothing) {
  fs::path root = fs::temp_directory_path() / ("weft_resume_bad_" + std::to_string(::getpid()));
  fs::remove_all(root);
  save_dp2(root.string(), 2, 2);
  fs::path shard = fs::path(checkpoint::resolve_checkpoint(root.string(), "x")) / "shard-00000.bin";
  ASSERT_TRUE(fs::exists(shard));
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(fs::file_size(shard) / 2));
    char b = 0;
    f.read(&b, 1);
    f.seekp(std::streamoff(fs::file_size(shard) / 2));
    b = char(~b);
    f.write(&b, 1);
  }
  expect_refused(root.string(), {"parallel.pp=2"}, "shard-00000.bin");
  fs::remove_all(root);
}

TEST(ParallelResumeLong, AFolderOneRankCannotSeeFailsEveryRank) {
  fs::path root = fs::temp_directory_path() / ("weft_resume_miss_" + std::to_string(::getpid()));
  fs::remove_all(root);
  save_dp2(root.string(), 2, 2);
  expect_refused(root.string(), {"parallel.pp=2"}, "missing", (root / "missing").string());
  fs::remove_all(root);
}

// Through the binary: `weft run` on 4 ranks saves with checkpoint.every, `weft run` on 2
// ranks resumes with --resume, and its losses continue the saving run's.
TEST(ParallelResumeLong, WeftRunSavesOnFourRanksAndResumesOnTwo) {
  fs::path d = fs::temp_directory_path() / ("weft_resume_cli_" + std::to_string(::getpid()));
  fs::remove_all(d);
  auto run = [](const std::string& cmdline) {
    std::string cmd = "OMP_NUM_THREADS=1 " + cmdline + " 2>&1";
    std::FILE* p = ::popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    int status = ::pclose(p);
    return std::make_pair(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out);
  };
  auto losses = [](const fs::path& metrics) {
    std::vector<double> out;
    for (const auto& row : core::io::read_metrics(metrics.string()))
      if (!row.is_validation()) out.push_back(row.at("loss"));
    return out;
  };
  const std::string weft = WEFT_BINARY;
  const std::string common =
      " train --config " + std::string(WEFT_SOURCE_DIR) +
      "/configs/gpt-layout.yaml --set train.steps=12 --set train.log_every=1";
  auto [code_a, out_a] = run(
      weft + " run --standalone --nproc-per-node 4 -- weft" + common +
      " --set parallel.dp=2 --set parallel.tp=2 --set checkpoint.every=10 --set checkpoint.dir=" +
      (d / "ck").string() + " --set train.out_dir=" + (d / "a").string());
  ASSERT_EQ(code_a, 0) << out_a;
  ASSERT_TRUE(fs::exists(d / "ck" / "step-00000010" / "metadata.json")) << out_a;
  // Rank 0 alone prints the save line, with the size of the committed folder.
  const std::string line = "checkpoint: step 10 saved to " + (d / "ck" / "step-00000010").string();
  EXPECT_NE(out_a.find(line), std::string::npos) << out_a;
  EXPECT_EQ(out_a.find(line), out_a.rfind(line)) << "printed once\n" << out_a;
  auto [code_b, out_b] = run(weft + " run --standalone --nproc-per-node 2 -- weft" + common +
                             " --set parallel.pp=2 --resume " + (d / "ck").string() +
                             " --set train.out_dir=" + (d / "b").string());
  ASSERT_EQ(code_b, 0) << out_b;
  EXPECT_NE(out_b.find("resumed from"), std::string::npos) << out_b;
  std::vector<double> a = losses(d / "a" / "metrics.jsonl"), b = losses(d / "b" / "metrics.jsonl");
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), 2u) << "steps 10 and 11 only";
  for (size_t i = 0; i < b.size(); ++i)
    EXPECT_NEAR(b[i], a[10 + i], 1e-6 * std::fabs(a[10 + i])) << "step " << 10 + i;
  fs::remove_all(d);
}

}  // namespace
}  // namespace weft::test::resume
