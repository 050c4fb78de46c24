// Resume: a run saved at step 10 and resumed continues with bitwise the same losses as the
// run that never stopped (sync and async saves, GPT and MoE), and periodic saves keep the
// last N step folders.
#include <gtest/gtest.h>

#include "tests/checkpoint/ckpt_util.h"

namespace weft::checkpoint {
namespace {

using test_util::TempDir;
using test_util::tiny_job;
using test_util::train;

void resume_matches(bool moe, bool async) {
  TempDir dir;
  core::JobSpec spec = tiny_job(moe);
  spec.checkpoint.dir = dir.str();
  spec.checkpoint.every = 5;
  spec.checkpoint.keep = 2;
  spec.checkpoint.async = async;
  core::data::TokenDataset data = core::data::TokenDataset::load(spec);

  core::Trainer straight(spec);
  std::vector<double> expect = train(straight, data, 14);

  {
    core::Trainer first(spec);
    TrainerCheckpoints ckpt(spec, first);
    train(first, data, 10, &ckpt);
    ckpt.finish();
  }
  std::vector<std::string> kept = list_checkpoints(dir.str());
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_NE(kept.back().find("step-00000010"), std::string::npos);

  core::JobSpec again = spec;
  again.checkpoint.every = 0;
  core::Trainer second(again);
  TrainerCheckpoints resumed(again, second, dir.str());
  ASSERT_EQ(second.current_step(), 10);
  std::vector<double> tail = train(second, data, 14);
  ASSERT_EQ(tail.size(), 4u);
  for (size_t i = 0; i < tail.size(); ++i)
    EXPECT_EQ(tail[i], expect[10 + i])
        << "step " << 10 + i << " (bitwise: the layout is unchanged)";
}

TEST(CheckpointResume, GptSyncSaveResumesBitwise) { resume_matches(false, false); }
TEST(CheckpointResume, GptAsyncSaveResumesBitwise) { resume_matches(false, true); }
TEST(CheckpointResume, MoeAsyncSaveResumesBitwise) { resume_matches(true, true); }

TEST(CheckpointResume, KeepsTheLastN) {
  TempDir dir;
  core::JobSpec spec = tiny_job();
  spec.checkpoint.dir = dir.str();
  spec.checkpoint.every = 1;
  spec.checkpoint.keep = 3;
  spec.checkpoint.async = false;
  core::data::TokenDataset data = core::data::TokenDataset::load(spec);
  core::Trainer t(spec);
  TrainerCheckpoints ckpt(spec, t);
  train(t, data, 7, &ckpt);
  std::vector<std::string> kept = list_checkpoints(dir.str());
  ASSERT_EQ(kept.size(), 3u);
  EXPECT_NE(kept[0].find("step-00000005"), std::string::npos);
  EXPECT_NE(kept[2].find("step-00000007"), std::string::npos);
}

TEST(CheckpointResume, ResumeChecksTheSeedAndTheBatch) {
  TempDir dir;
  core::JobSpec spec = tiny_job();
  spec.checkpoint.dir = dir.str();
  spec.checkpoint.async = false;
  core::Trainer t(spec);
  TrainerCheckpoints(spec, t).save();
  core::JobSpec other = spec;
  other.train.seed += 1;
  core::Trainer u(other);
  try {
    TrainerCheckpoints c(other, u, dir.str());
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "--resume");
    EXPECT_NE(std::string(e.what()).find("train.seed"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace weft::checkpoint
