// The command line: `weft train` with checkpoint.every saves, `--resume` continues with the
// same losses, `weft ckpt export` writes what --save-weights writes (PyTorch names), `import`
// makes a checkpoint that resumes from those weights, and bad input exits 2 with the field.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>

#include "core/io/metrics.h"
#include "core/io/safetensors.h"
#include "tests/checkpoint/ckpt_util.h"
#include "tests/support/run_weft.h"

namespace weft::checkpoint {
namespace {

using test_util::TempDir;

using CmdResult = ::weft::test::CommandResult;
CmdResult weft(const std::string& args) { return ::weft::test::run_weft(args); }

using test_util::losses;
using test_util::train_cmd;

class CkptCli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(WEFT_BINARY)) << WEFT_BINARY << " is built with every test";
  }
};

TEST_F(CkptCli, TrainResumeExportImport) {
  TempDir d;
  const std::string ck = d.str() + "/ckpt";
  CmdResult full = weft(train_cmd(d, "full", "--save-weights " + d.str() + "/full.safetensors"));
  ASSERT_EQ(full.code, 0) << full.out;
  CmdResult first = weft(train_cmd(d, "first",
                                   "--set checkpoint.every=6 --set checkpoint.dir=" + ck +
                                       " --set checkpoint.keep=2 --set checkpoint.async=true"));
  ASSERT_EQ(first.code, 0) << first.out;
  std::vector<std::string> kept = list_checkpoints(ck);
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_NE(kept[0].find("step-00000006"), std::string::npos);

  // Resume from the step-6 folder: steps 6..11 as in the run that never stopped.
  CmdResult resumed = weft(train_cmd(d, "resumed", "--resume " + kept[0]));
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  std::map<int64_t, double> a = losses(d.str() + "/full.jsonl"),
                            b = losses(d.str() + "/resumed.jsonl");
  ASSERT_EQ(b.size(), 6u);
  for (auto& [step, loss] : b) EXPECT_EQ(loss, a.at(step)) << "step " << step;

  // Export of the step-12 checkpoint = the weights the uninterrupted run saved, by name.
  CmdResult ex = weft("ckpt export " + ck + " " + d.str() + "/export.safetensors");
  ASSERT_EQ(ex.code, 0) << ex.out;
  auto want = core::io::load_safetensors(d.str() + "/full.safetensors");
  auto got = core::io::load_safetensors(d.str() + "/export.safetensors");
  ASSERT_EQ(got.size(), want.size());
  for (auto& [name, t] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_TRUE(test_util::same_bytes(t, got.at(name))) << name;
  }

  // Import: a step-0 checkpoint with those weights; resuming from it trains from them.
  const std::string imported = d.str() + "/imported";
  CmdResult im = weft("ckpt import " + d.str() + "/full.safetensors " + imported + " --config " +
                      std::string(WEFT_SOURCE_DIR) + "/configs/gpt-tiny.yaml");
  ASSERT_EQ(im.code, 0) << im.out;
  CmdResult v = weft("ckpt verify " + imported);
  EXPECT_EQ(v.code, 0) << v.out;
  CmdResult from_import = weft(train_cmd(d, "imp", "--set train.steps=2 --resume " + imported));
  CmdResult from_init = weft(
      train_cmd(d, "init", "--set train.steps=2 --init-weights " + d.str() + "/full.safetensors"));
  ASSERT_EQ(from_import.code, 0) << from_import.out;
  ASSERT_EQ(from_init.code, 0) << from_init.out;
  EXPECT_EQ(losses(d.str() + "/imp.jsonl"), losses(d.str() + "/init.jsonl"));
}

TEST_F(CkptCli, BadInputExitsTwoNamingTheField) {
  TempDir d;
  CmdResult missing = weft(train_cmd(d, "x", "--resume " + d.str() + "/nothing-here"));
  EXPECT_EQ(missing.code, 2) << missing.out;
  EXPECT_NE(missing.out.find("--resume"), std::string::npos) << missing.out;
  CmdResult bad = weft("ckpt export " + d.str() + " " + d.str() + "/o.safetensors");
  EXPECT_EQ(bad.code, 2) << bad.out;
  CmdResult unknown = weft("ckpt frobnicate");
  EXPECT_EQ(unknown.code, 2) << unknown.out;
}

}  // namespace
}  // namespace weft::checkpoint
