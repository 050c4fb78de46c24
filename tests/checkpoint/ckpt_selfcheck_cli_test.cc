// Checkpoints that verify themselves, through the `weft` binary: an edited metadata.json
// (a box offset, the step) is refused by `weft ckpt verify` and by --resume naming the file;
// `--resume ROOT` skips a stale higher step folder or a corrupted newest one and says why;
// retention keeps the fresh saves; import refuses a non-empty folder without --force and
// non-finite weights; every save prints its line.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <regex>

#include "core/io/metrics.h"
#include "core/io/safetensors.h"
#include "tests/checkpoint/ckpt_util.h"
#include "tests/support/poison_safetensors.h"
#include "tests/support/run_weft.h"

namespace weft::checkpoint {
namespace {

namespace fs = std::filesystem;
using test_util::TempDir;
using CmdResult = ::weft::test::CommandResult;

CmdResult weft(const std::string& args) { return ::weft::test::run_weft(args); }

const std::string kConfig = std::string(WEFT_SOURCE_DIR) + "/configs/gpt-tiny.yaml";

using test_util::losses;
using test_util::train_cmd;

void write_file(const std::string& p, const std::string& text) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
}

bool has(const std::string& out, const std::string& what) {
  return out.find(what) != std::string::npos;
}

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

class CkptSelfCheck : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(WEFT_BINARY)) << WEFT_BINARY << " is built with every test";
  }
  // An uninterrupted 12-step run (losses in full.jsonl) and one that saved at steps 6 and 12
  // into ck/ (checkpoint.keep 2).
  void two_checkpoints(const TempDir& d) {
    CmdResult full = weft(train_cmd(d, "full", "--save-weights " + d.str() + "/full.safetensors"));
    ASSERT_EQ(full.code, 0) << full.out;
    CmdResult saving = weft(train_cmd(d, "saving",
                                      "--set checkpoint.every=6 --set checkpoint.keep=2 --set "
                                      "checkpoint.async=false --set checkpoint.dir=" +
                                          d.str() + "/ck"));
    ASSERT_EQ(saving.code, 0) << saving.out;
    ASSERT_TRUE(fs::exists(d.path / "ck/step-00000006/metadata.json"));
    ASSERT_TRUE(fs::exists(d.path / "ck/step-00000012/metadata.json"));
  }
  // The resumed run continued the uninterrupted one from `from`, bit for bit.
  void expect_continues(const TempDir& d, const std::string& name, int64_t from) {
    std::map<int64_t, double> a = losses(d.str() + "/full.jsonl"),
                              b = losses(d.str() + "/" + name + ".jsonl");
    ASSERT_EQ(b.size(), size_t(12 - from));
    EXPECT_EQ(b.begin()->first, from);
    for (auto& [step, loss] : b) EXPECT_EQ(loss, a.at(step)) << "step " << step;
  }
};

TEST_F(CkptSelfCheck, AnEditedBoxOffsetIsRefusedByVerifyAndByResume) {
  TempDir d;
  two_checkpoints(d);
  const std::string step12 = d.str() + "/ck/step-00000012", meta = step12 + "/metadata.json";
  // Shift the second box one f32 earlier: still a valid box inside the file, so only the
  // metadata's own checksum can tell.
  std::string text = test_util::read_file(meta);
  std::smatch mt;
  ASSERT_TRUE(std::regex_search(text, mt, std::regex("\"offset\": ([1-9][0-9]*)")));
  const int64_t off = std::stoll(mt[1].str());
  text.replace(size_t(mt.position(1)), size_t(mt.length(1)), std::to_string(off - 4));
  write_file(meta, text);

  CmdResult v = weft("ckpt verify " + step12);
  EXPECT_EQ(v.code, 2) << v.out;
  EXPECT_TRUE(has(v.out, meta)) << v.out;
  EXPECT_TRUE(has(v.out, "metadata_crc32c")) << v.out;
  CmdResult all = weft("ckpt verify " + d.str() + "/ck");
  EXPECT_EQ(all.code, 2) << all.out;
  EXPECT_TRUE(has(all.out, "step-00000006: step 6")) << "the older one still verifies\n" << all.out;

  CmdResult named = weft(train_cmd(d, "named", "--resume " + step12));
  EXPECT_EQ(named.code, 2) << named.out;
  EXPECT_TRUE(has(named.out, "--resume")) << named.out;
  EXPECT_TRUE(has(named.out, meta)) << named.out;
  EXPECT_FALSE(fs::exists(d.path / "named.jsonl")) << "refused before training";

  CmdResult root = weft(train_cmd(d, "fallback", "--resume " + d.str() + "/ck"));
  ASSERT_EQ(root.code, 0) << root.out;
  EXPECT_TRUE(has(root.out, "resume: skipped " + step12 + ": ")) << root.out;
  EXPECT_TRUE(has(root.out, "resumed from " + d.str() + "/ck/step-00000006 at step 6")) << root.out;
  expect_continues(d, "fallback", 6);
}

TEST_F(CkptSelfCheck, AnEditedStepIsRefusedEvenWithAMatchingChecksum) {
  TempDir d;
  two_checkpoints(d);
  const std::string step12 = d.str() + "/ck/step-00000012", meta = step12 + "/metadata.json";
  const std::string original = test_util::read_file(meta);
  // A hand edit of both step fields: the checksum no longer matches.
  write_file(meta, std::regex_replace(original, std::regex("\"step\": 12"), "\"step\": 11"));
  CmdResult edited = weft("ckpt verify " + step12);
  EXPECT_EQ(edited.code, 2) << edited.out;
  EXPECT_TRUE(has(edited.out, meta) && has(edited.out, "metadata_crc32c")) << edited.out;
  // A tool that rewrites the checksum too: the folder's name still binds the step.
  Metadata m = metadata_from_json(original, meta);
  m.step = 11;
  write_file(meta, metadata_to_json(m));
  CmdResult rewritten = weft("ckpt verify " + step12);
  EXPECT_EQ(rewritten.code, 2) << rewritten.out;
  EXPECT_TRUE(has(rewritten.out, "says step 11 but its folder is step-00000012")) << rewritten.out;
  CmdResult resumed = weft(train_cmd(d, "r", "--resume " + step12));
  EXPECT_EQ(resumed.code, 2) << resumed.out;
  EXPECT_TRUE(has(resumed.out, "--resume") && has(resumed.out, meta)) << resumed.out;
}

TEST_F(CkptSelfCheck, AStaleHigherStepIsSkippedAndRetentionKeepsTheFreshSaves) {
  TempDir d;
  const std::string ck = d.str() + "/ck";
  // A constant learning rate, so that a run of 6 steps is the first half of one of 12.
  const std::string constant = "--set train.schedule=constant ";
  CmdResult full = weft(train_cmd(d, "full", constant));
  ASSERT_EQ(full.code, 0) << full.out;
  // An older run left step 6; a copy of it renamed step-99999999 is the stale folder.
  CmdResult first = weft(train_cmd(d, "first",
                                   constant +
                                       "--set train.steps=6 --set checkpoint.every=6 --set "
                                       "checkpoint.keep=1 --set checkpoint.dir=" +
                                       ck));
  ASSERT_EQ(first.code, 0) << first.out;
  fs::copy(ck + "/step-00000006", ck + "/step-99999999");

  // This job resumes at 6 and saves at 8, 10, 12 with keep 1.
  CmdResult second = weft(train_cmd(d, "second",
                                    constant + "--resume " + ck +
                                        " --set checkpoint.every=2 --set checkpoint.keep=1 --set "
                                        "checkpoint.async=true --set checkpoint.dir=" +
                                        ck));
  ASSERT_EQ(second.code, 0) << second.out;
  EXPECT_TRUE(has(second.out, "resume: skipped " + ck + "/step-99999999: ")) << second.out;
  EXPECT_TRUE(has(second.out, "says step 6 but its folder is step-99999999")) << second.out;
  EXPECT_TRUE(has(second.out, "resumed from " + ck + "/step-00000006 at step 6")) << second.out;
  expect_continues(d, "second", 6);
  // Retention removed only this job's older saves (8, 10): the other job's step 6 and the
  // stale folder stay, and this job's newest save is there.
  EXPECT_EQ(names_in(ck),
            (std::vector<std::string>{"step-00000006", "step-00000012", "step-99999999"}));
  CmdResult v = weft("ckpt verify " + ck + "/step-00000012");
  EXPECT_EQ(v.code, 0) << v.out;
  // Resuming again takes step 12 and says why the stale one was skipped.
  CmdResult third = weft(train_cmd(d, "third", "--set train.steps=14 --resume " + ck));
  ASSERT_EQ(third.code, 0) << third.out;
  EXPECT_TRUE(has(third.out, "resume: skipped " + ck + "/step-99999999")) << third.out;
  EXPECT_TRUE(has(third.out, "resumed from " + ck + "/step-00000012 at step 12")) << third.out;
}

TEST_F(CkptSelfCheck, ACorruptedNewestShardFallsBackToThePreviousCheckpoint) {
  TempDir d;
  two_checkpoints(d);
  const std::string step12 = d.str() + "/ck/step-00000012";
  const fs::path shard = fs::path(step12) / "shard-00000.bin";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(fs::file_size(shard) / 2));
    char c = 0;
    f.read(&c, 1);
    c = char(c ^ 0x01);
    f.seekp(std::streamoff(fs::file_size(shard) / 2));
    f.write(&c, 1);
  }
  CmdResult root = weft(train_cmd(d, "fallback", "--resume " + d.str() + "/ck"));
  ASSERT_EQ(root.code, 0) << root.out;
  EXPECT_TRUE(has(root.out, "resume: skipped " + step12 + ": checkpoint shard")) << root.out;
  EXPECT_TRUE(has(root.out, "corrupted")) << root.out;
  expect_continues(d, "fallback", 6);
  CmdResult named = weft(train_cmd(d, "named", "--resume " + step12));
  EXPECT_EQ(named.code, 2) << "a named step folder has no fallback\n" << named.out;
  EXPECT_TRUE(has(named.out, "shard-00000.bin")) << named.out;
}

TEST_F(CkptSelfCheck, ImportRefusesANonEmptyFolderUnlessForced) {
  TempDir d;
  two_checkpoints(d);
  const std::string ck = d.str() + "/ck";
  const std::vector<std::string> before = names_in(ck);
  const std::string import =
      "ckpt import " + d.str() + "/full.safetensors " + ck + " --config " + kConfig;
  CmdResult refused = weft(import);
  EXPECT_EQ(refused.code, 2) << refused.out;
  EXPECT_TRUE(has(refused.out, "DIR") && has(refused.out, "--force")) << refused.out;
  EXPECT_TRUE(has(refused.out, "step-00000012")) << refused.out;
  EXPECT_EQ(names_in(ck), before) << "nothing written";

  CmdResult forced = weft(import + " --force");
  ASSERT_EQ(forced.code, 0) << forced.out;
  EXPECT_TRUE(has(forced.out, "--resume " + ck + "/step-00000000")) << forced.out;
  std::vector<std::string> after = before;
  after.insert(after.begin(), "step-00000000");
  EXPECT_EQ(names_in(ck), after) << "the import is kept and the newer checkpoints too";
  CmdResult from_import =
      weft(train_cmd(d, "imp", "--set train.steps=2 --resume " + ck + "/step-00000000"));
  ASSERT_EQ(from_import.code, 0) << from_import.out;
  EXPECT_TRUE(has(from_import.out, "at step 0")) << from_import.out;
}

TEST_F(CkptSelfCheck, NonFiniteWeightsAreNeverWrittenToACheckpoint) {
  TempDir d;
  CmdResult full = weft(
      train_cmd(d, "full", "--set train.steps=1 --save-weights " + d.str() + "/w.safetensors"));
  ASSERT_EQ(full.code, 0) << full.out;
  fs::copy_file(d.str() + "/w.safetensors", d.str() + "/nan.safetensors");
  test::poison_safetensors(d.str() + "/nan.safetensors", "h.0.attn.qkv.weight", std::nanf(""));
  const std::string out = d.str() + "/imported";
  CmdResult im =
      weft("ckpt import " + d.str() + "/nan.safetensors " + out + " --config " + kConfig);
  EXPECT_EQ(im.code, 2) << im.out;
  EXPECT_TRUE(has(im.out, "IN.safetensors") && has(im.out, "h.0.attn.qkv.weight")) << im.out;
  EXPECT_TRUE(!fs::exists(out) || names_in(out).empty())
      << "no step folder and no temporary folder left";
}

// The save line's size is the folder's, to the 0.01 MiB it prints.
void expect_save_lines(const std::string& out, const std::string& ck, const char* mode) {
  std::regex line(
      "checkpoint: step (\\d+) saved to (\\S+) \\(([0-9.]+) MiB, ([0-9.]+) s, (\\w+)\\)");
  int n = 0;
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it, ++n) {
    const std::smatch& m = *it;
    EXPECT_EQ(m[5].str(), mode);
    char name[32];
    std::snprintf(name, sizeof name, "step-%08lld", std::stoll(m[1].str()));
    EXPECT_EQ(m[2].str(), ck + "/" + name);
    if (fs::exists(m[2].str())) {
      EXPECT_NEAR(std::stod(m[3].str()),
                  double(test_util::folder_bytes(m[2].str())) / (1024.0 * 1024.0), 0.006);
    }
  }
  EXPECT_EQ(n, 2) << out;
}

TEST_F(CkptSelfCheck, EverySavePrintsItsLine) {
  TempDir d;
  for (const char* mode : {"sync", "async"}) {
    const std::string ck = d.str() + "/ck-" + mode;
    CmdResult r = weft(train_cmd(d, mode,
                                 "--set checkpoint.every=6 --set checkpoint.keep=2 --set "
                                 "checkpoint.async=" +
                                     std::string(mode == std::string("async") ? "true" : "false") +
                                     " --set checkpoint.dir=" + ck));
    ASSERT_EQ(r.code, 0) << r.out;
    expect_save_lines(r.out, ck, mode);
  }
}

}  // namespace
}  // namespace weft::checkpoint
